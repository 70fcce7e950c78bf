"""The adapter interface: what an implementation supports (as data) and how it is called.

Subclass Adapter, declare what the implementation supports and which CAPABILITIES it has, and
register it in suites/adapters/__init__.py ADAPTERS.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from suites.cases import AttnCase
from te_ref.layouts import ATTN_MASK_TYPES, LAYOUTS

# What an implementation can do beyond computing a case (each a flag on Adapter). A test that
# needs one runs through every selected adapter and skips, with the adapter's reason, where the
# flag is False.
CAPABILITIES = {
    "dropout": "attention dropout in training mode, SPEC §2.6",
    "dropout_ctx": "attention_dropout_ctx: dropout runs inside the context it gives (an RNG "
    "tracker's fork), SPEC §4",
    "validates_arguments": "TE's argument checks, a ValueError naming the problem",
    "traceable": "torch.compile(fullgraph=True) traces the module (the CPU compile variants)",
    "capturable": "CUDA-graph capture: torch.compile mode='reduce-overhead', cudagraphs backend",
    "sync_free": "no host synchronisation in the non-FP8 forward and backward, SPEC §3",
    "deterministic": "the same bytes from repeated forward and backward calls: without dropout, "
    "and with dropout under one seed",
    "fp8_state": "FP8 scaling state readable after a pass (read_fp8_state): each role's amax "
    "history, the scale it quantized with and the next scale",
}
# The FP8 roles (TE's names): the quantized inputs, softmax output and output in the forward;
# the output gradient, softmax gradient and input gradients in the backward.
FP8_ROLES = ("QKV", "S", "O", "dO", "dP", "dQKV")


def distribution_version(module: str) -> str | None:
    """"<distribution> <version>" of the installed distribution that provides ``module``'s
    top-level package (importlib.metadata), or None where none does."""
    import importlib.metadata

    top = module.partition(".")[0]
    try:
        names = importlib.metadata.packages_distributions().get(top) or []
        for name in names:
            return f"{name} {importlib.metadata.version(name)}"
    except Exception:  # broken metadata: the version is unknown, not an error
        return None
    return None


@dataclass(frozen=True)
class FP8RoleState:
    """One FP8 role's scaling state after a forward and backward pass (Adapter.read_fp8_state).
    Float32 tensors on the module's device. ``amax_history`` is 1-D and newest first: [0] is this
    pass's amax (a role under current scaling keeps [amax])."""

    amax_history: torch.Tensor
    scale_used: torch.Tensor  # 0-d: the scale this pass quantized the role with
    scale: torch.Tensor  # 0-d: the scale the next pass will use (current scaling: this pass's)


def _declaration_site() -> str:
    """"path:line" of the code that constructs a Difference: the first frame outside this file
    and dataclass's generated __init__; the path relative to the folder above its top-level
    package (e.g. "hf_sdpa/adapter.py:57"), so that it reads the same wherever it is installed."""
    frame = sys._getframe(1)
    here = Path(__file__).resolve()
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and Path(name).resolve() != here:
            break
        frame = frame.f_back
    if frame is None:
        return "?"
    path = Path(frame.f_code.co_filename).resolve()
    top = path.parent
    while (top / "__init__.py").is_file():
        top = top.parent
    return f"{path.relative_to(top).as_posix()}:{frame.f_lineno}"


@dataclass(frozen=True)
class Difference:
    """A known, understood difference of an implementation from the standard, declared by its
    adapter (``Adapter.differences``) in the adapter's own package. The suites' plugin runs every
    test it matches as a STRICT expected failure: the test must fail, and only by value checks
    (SPEC §6's error ratio or the exact zero rows: numerics.VALUE_CHECKS) of the declared
    ``tensors``; a failure of another tensor or another check, or an exception of the run, fails
    the test, and so does passing (XPASS(strict): the difference no longer shows).

    A test matches when all of these hold:
    - ``test``: the test function's name, or an fnmatch pattern over it ("test_alignment",
      "test_*"), or a tuple of them (any matches);
    - ``ids``: (optional) an fnmatch pattern over the test's parameter id, the text between [ ]
      ("*-one_token-*"), or a tuple of them (any matches): for tests whose case is no AttnCase
      parameter, or for a list of cases a predicate cannot tell (a kernel's rounding);
    - ``where``: (optional) a predicate over the test's AttnCase parameter; a test without one
      does not match.
    ``tensors`` names the tensors as the checks do ("out", "dq", "dk", "dv", "dbias",
    "dsoftmax_offset", "max_logit"; a comma-separated string is accepted); a case may fail on
    any non-empty subset of them. ``reason`` is the diagnosis, shown as the xfail reason and in
    the report with ``defined_at`` (where the Difference was constructed, set automatically).

    ``strict=False`` is for a difference whose occurrence moves with the machine, and only
    that: another implementation's rounding one or two elements past SPEC §6's bound, where
    torch's CPU kernels differ by instruction set (say so in the reason). Such a case that
    passes is XPASS, listed in the report, not a failure; it still fails on any other tensor,
    check or exception. Everything the implementation does by design stays strict."""

    test: str | tuple[str, ...]
    tensors: tuple[str, ...]
    reason: str
    where: Callable[[AttnCase], bool] | None = None
    ids: str | tuple[str, ...] | None = None
    strict: bool = True
    defined_at: str = field(default="", compare=False)

    def __post_init__(self):
        tensors = self.tensors
        if isinstance(tensors, str):
            tensors = tensors.split(",")
        tensors = tuple(t.strip() for t in tensors if t.strip())
        if not tensors:
            raise ValueError("Difference: name the tensors that differ (tensors=)")
        if not self.test or not self.reason:
            raise ValueError("Difference: test= and reason= are required")
        object.__setattr__(self, "tensors", tensors)
        if isinstance(self.test, str):
            object.__setattr__(self, "test", (self.test,))
        if isinstance(self.ids, str):
            object.__setattr__(self, "ids", (self.ids,))
        if not self.defined_at:
            object.__setattr__(self, "defined_at", _declaration_site())

    def matches(self, test: str, param_id: str, case: AttnCase | None) -> bool:
        """Whether this difference covers the test ``test`` (function name) with parameter id
        ``param_id`` and AttnCase parameter ``case`` (None where it has none)."""
        if not any(fnmatch.fnmatchcase(test, p) for p in self.test):
            return False
        if self.ids is not None and not any(fnmatch.fnmatchcase(param_id, p) for p in self.ids):
            return False
        if self.where is None:
            return True
        if case is None:
            return False
        try:
            return bool(self.where(case))
        except Exception as e:
            raise RuntimeError(
                f"Difference declared at {self.defined_at}: where({case.id}) raised "
                f"{type(e).__name__}: {e}"
            ) from e


class Adapter:
    """One implementation under test."""

    name = "?"
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    layouts: tuple[str, ...] = tuple(LAYOUTS)
    mask_types: tuple[str, ...] = ATTN_MASK_TYPES
    bias_types: tuple[str, ...] = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
    softmax_types: tuple[str, ...] = ("vanilla", "off-by-one", "learnable")
    supports_fp8 = False
    supports_max_logit = True
    supports_window = True
    # One flag per optional forward argument (docs/adapters.md): a case that passes the argument
    # skips, with a reason, on an adapter whose flag is False (instead of a TypeError).
    supports_bottom_right_diagonal = True  # bottom_right_diagonal (an alignment override)
    supports_alibi_slopes = True  # alibi_slopes (user slopes; without them: the default slopes)
    supports_softmax_offset = True  # softmax_offset (the learnable softmax's [h] forward argument)
    supports_cu_seqlens_padding = True  # padding* on sbhd/bshd with lengths as cu_seqlens_q/kv
    supports_padding_mask = True  # padding* on sbhd/bshd with lengths as attention_mask
    dropout = False
    dropout_ctx = False
    validates_arguments = False
    # The exception types the implementation raises for arguments it refuses (TE asserts:
    # AssertionError); a case that must be refused expects one of these.
    argument_errors: tuple[type[Exception], ...] = (ValueError,)
    traceable = True
    capturable = False
    sync_free = False
    deterministic = False
    fp8_state = False
    why_not: dict[str, str] = {}  # capability -> why this adapter lacks it (the skip reason)
    # capability -> the only device types where the adapter has it (elsewhere a test that needs
    # it skips with why_not[capability]); a capability not named here holds on every device.
    capability_devices: dict[str, tuple[str, ...]] = {}
    why_unsupported: dict[str, str] = {}  # an unsupported device/dtype/layout/... value -> why
    default = True  # selected when no --impl is given
    # Known, understood differences from the standard, each a strict expected failure of the
    # tests it matches (Difference; docs/adapters.md#declared-differences)
    differences: tuple[Difference, ...] = ()

    def lacks(self, capability: str) -> str | None:
        """Why the adapter cannot run a test that needs ``capability`` (None when it can)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}; known: {sorted(CAPABILITIES)}")
        if getattr(self, capability):
            return None
        why = self.why_not.get(capability, "not declared by the adapter")
        return f"{self.name} lacks {capability} ({CAPABILITIES[capability]}): {why}"

    def lacks_on(self, capability: str, device: str) -> str | None:
        """Why the adapter cannot run a test that needs ``capability`` on ``device`` (a device
        type, "cpu" or "cuda"); None when it can."""
        reason = self.lacks(capability)
        only = self.capability_devices.get(capability)
        if reason is None and only is not None and device not in only:
            why = self.why_not.get(capability, f"declared for {', '.join(only)} only")
            what = CAPABILITIES[capability]
            reason = f"{self.name} lacks {capability} on {device} ({what}): {why}"
        return reason

    def not_supported_reasons(self, case: AttnCase) -> list[str]:
        """Why this adapter cannot run the case (empty when it can)."""
        reasons = []
        for what, value, allowed in (
            ("device", case.device, self.devices),
            ("dtype", case.dtype, self.dtypes),
            ("layout", case.layout, self.layouts),
            ("mask type", case.mask_type, self.mask_types),
            ("bias type", case.bias_type, self.bias_types),
            ("softmax type", case.softmax_type, self.softmax_types),
        ):
            if value not in allowed:
                why = self.why_unsupported.get(value)
                reasons.append(
                    f"{self.name} does not support {what} {value!r}" + (f": {why}" if why else "")
                )
        for lacked, why_key, reason in (
            (case.return_max_logit and not self.supports_max_logit, "max_logit",
             f"{self.name} does not return max_logit"),
            (case.window is not None and not self.supports_window, "window",
             f"{self.name} has no sliding window"),
        ):  # fmt: skip
            if lacked:
                why = self.why_unsupported.get(why_key)
                reasons.append(reason + (f": {why}" if why else ""))
        reasons += [
            f"{self.name} takes no {what}" + (f": {why}" if why else "")
            for what, why in self.unsupported_arguments(case)
        ]
        return reasons

    def unsupported_arguments(self, case: AttnCase) -> list[tuple[str, str | None]]:
        """(forward argument, why) for each optional argument the case passes that the adapter's
        supports_* flags decline; the reason is ``why_unsupported[key]``, key the flag's name
        without ``supports_`` (``"bottom_right_diagonal"``, ``"cu_seqlens_padding"``, ...)."""
        padded_bshd = case.mask_type.startswith("padding") and case.layout_info.q_format != "thd"
        needs = (
            ("bottom_right_diagonal", "bottom_right_diagonal (alignment override)",
             case.bottom_right_diagonal is not None),
            ("alibi_slopes", "alibi_slopes (user ALiBi slopes)",
             case.bias_type == "alibi" and case.alibi_slopes is not None),
            ("softmax_offset", "softmax_offset (the learnable softmax's offset argument)",
             case.softmax_type == "learnable"),
            ("cu_seqlens_padding", "cu_seqlens_q/cu_seqlens_kv on sbhd/bshd (padding lengths)",
             padded_bshd and case.padding_from == "cu_seqlens"),
            ("padding_mask", "attention_mask as a padding mask",
             padded_bshd and case.padding_from == "mask"),
        )  # fmt: skip
        return [
            (what, self.why_unsupported.get(key))
            for key, what, passed in needs
            if passed and not getattr(self, f"supports_{key}")
        ]

    def version(self) -> str | None:
        """What the report names as the judged implementation's version: by default the
        distribution (name and version, from its package metadata) that holds this adapter's
        module; an adapter of a third-party implementation returns that implementation's
        (``transformers 4.57.6``). None when unknown."""
        return distribution_version(type(self).__module__)

    def unavailable_reason(self, device: str) -> str | None:
        """Why the adapter cannot run on this machine right now (checked at run time)."""
        return None

    def known_deviations(
        self, case: AttnCase, lengths=None, expected=None, call_kwargs=None
    ) -> tuple:
        """The recorded departures of this implementation from the standard (SPEC §7: for
        Transformer Engine, its "TE deviations", suites/te_deviations.py) that make this case's
        result differ: ``lengths`` is ([lq per batch element], [lkv per batch element]) where
        padding applies, ``expected`` the documented probability grids ([batch][head] -> rows of
        '1' kept / '.' masked) where the suite has them, ``call_kwargs`` the call's forward
        keyword arguments (attention_mask, cu_seqlens) where the suite has them. A suite runs a
        case with deviations as a strict expected failure: it must differ, so that a fixed
        deviation is noticed; ``str(deviation)`` is the xfail reason."""
        return ()

    def build(
        self, case: AttnCase, scale: float | None, dropout: float = 0.0, dropout_ctx=None
    ) -> torch.nn.Module:
        """A module computing the case's attention (what the compile suite compiles); ``scale``
        None asks for the implementation's default (dqk ** -0.5); ``dropout`` is the attention
        dropout probability in training mode (adapters with ``dropout`` only); ``dropout_ctx``,
        when given, a callable returning the context manager dropout must run in (TE's
        ``attention_dropout_ctx``; adapters with ``dropout_ctx`` only)."""
        raise NotImplementedError

    def lacks_fp8(self) -> str | None:
        """Why the adapter runs no FP8 case (None where it declares ``supports_fp8``); the reason
        is ``why_unsupported["fp8"]``."""
        if self.supports_fp8:
            return None
        why = self.why_unsupported.get("fp8")
        return f"{self.name} does not declare FP8 (supports_fp8)" + (f": {why}" if why else "")

    def fp8_recipe(self, recipe):
        """What the implementation's ``fp8_meta={"recipe": ...}`` takes for a suite's recipe
        (adapters with ``supports_fp8``). The suites describe recipes as
        te_ref.fp8.DelayedScaling or CurrentScaling, with Transformer Engine's field names:
        ``fp8_format`` ("E4M3", "E5M2", "HYBRID"), and for DelayedScaling ``margin``,
        ``amax_history_len``, ``amax_compute_algo``. The default passes the recipe on as it is."""
        return recipe

    def read_fp8_state(self, module) -> dict[str, FP8RoleState]:
        """Adapters with ``fp8_state``: ``module``'s FP8 scaling state after its last forward and
        backward pass in FP8, one FP8RoleState per role of FP8_ROLES."""
        raise NotImplementedError(f"{self.name} declares fp8_state but has no read_fp8_state")

    def call(self, module, case: AttnCase, q, k, v, kwargs: dict):
        """(out, max_logit or None, {leaf name: tensor that stands in for that leaf})."""
        result = module(q, k, v, **kwargs)
        out, max_logit = result if case.return_max_logit else (result, None)
        return out, max_logit, {}

    def run(self, case: AttnCase, q, k, v, kwargs: dict, scale: float):
        """One eager call on a fresh module."""
        return self.call(self.build(case, scale), case, q, k, v, kwargs)
