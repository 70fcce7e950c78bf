"""The adapter interface: what an implementation supports (its one declaration, ``support``),
how it is called, and the differences it declares.

Subclass Adapter, give it a ``name`` and a ``support = Support(...)`` (suites/adapters/
support.py), ``build`` (and ``call`` if the arguments need translating), and register it in
suites/adapters/__init__.py ADAPTERS or through the entry point group te_conformance.adapters.
docs/adapters.md is the contract, argument by argument.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from te_conformance.suites.adapters.support import (  # noqa: F401  (re-exported)
    ARGUMENTS,
    CAPABILITIES,
    OUTPUTS,
    Rule,
    Support,
)
from te_conformance.suites.cases import AttnCase
from te_conformance.suites.skips import Reason

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

    def expectation(self, adapter: str):
        """The expectation it makes of a test it matches (suites/expected.py): value failures
        of any of its tensors, strict unless ``strict=False``."""
        from te_conformance.suites.checks.failures import VALUE_CHECKS
        from te_conformance.suites.expected import Expectation

        return Expectation(
            source="declared", id=f"{adapter}:{'|'.join(self.test)}"
            + (f"[{'|'.join(self.ids)}]" if self.ids else ""),
            reason=self.reason, checks=VALUE_CHECKS, tensors=self.tensors, strict=self.strict,
            adapter=adapter, defined_at=self.defined_at,
        )  # fmt: skip

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


# The class attributes adapters declared support with before ``support`` (each now a field or
# an entry of Support); an adapter that still sets one is refused with a message saying so.
OLD_DECLARATIONS = (
    "devices", "dtypes", "layouts", "mask_types", "bias_types", "softmax_types",
    "supports_fp8", "supports_max_logit", "supports_window", "supports_bottom_right_diagonal",
    "supports_alibi_slopes", "supports_softmax_offset", "supports_cu_seqlens_padding",
    "supports_padding_mask", "dropout", "dropout_ctx", "validates_arguments", "traceable",
    "capturable", "sync_free", "deterministic", "fp8_state", "exact_one_key", "why_not",
    "capability_devices", "why_unsupported", "not_supported_reasons", "unsupported_arguments",
    "lacks", "lacks_on", "lacks_fp8",
)  # fmt: skip


class Adapter:
    """One implementation under test: its ``name``, its one support declaration (``support``),
    the differences from the standard it declares (``differences``), and how it is built and
    called."""

    name = "?"
    support: Support = Support()
    # Known, understood differences from the standard, each a strict expected failure of the
    # tests it matches (Difference; docs/adapters.md#declared-differences)
    differences: tuple[Difference, ...] = ()
    # The exception types the implementation raises for arguments it refuses (TE asserts:
    # AssertionError); a case that must be refused expects one of these.
    argument_errors: tuple[type[Exception], ...] = (ValueError,)
    default = False  # selected when no --impl is given

    def declines(
        self, case: AttnCase | None = None, needs=(), device=None, ignore=()
    ) -> list[Reason]:
        """Why this adapter cannot run ``case`` with the capabilities ``needs`` on ``device``
        (default: the case's): its support declaration applied (Support.declines); empty when
        it can."""
        return self.support.declines(self.name, case, needs, device, ignore)

    @classmethod
    def old_declarations(cls) -> list[str]:
        """The attributes of OLD_DECLARATIONS this adapter class (or a base other than Adapter)
        still sets."""
        return sorted(
            n for n in OLD_DECLARATIONS
            if any(n in vars(k) for k in cls.__mro__ if k not in (Adapter, object))
        )  # fmt: skip

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
        """The differences of this implementation that only the case's inputs tell (for
        Transformer Engine, its "TE deviations", suites/te_deviations.py): ``lengths`` is
        ([lq per batch element], [lkv per batch element]) where padding applies, ``expected``
        the documented probability grids ([batch][head] -> rows of '1' kept / '.' masked) where
        the suite has them, ``call_kwargs`` the call's forward keyword arguments
        (attention_mask, cu_seqlens) where the suite has them. Each returned object (an
        Expectation of suites/expected.py, or any object with ``id`` and ``reason``, optionally
        ``explains``) is expected for the case: it must differ, and only in the checks it
        explains, so that a fixed difference is noticed."""
        return ()

    def build(
        self, case: AttnCase, scale: float | None, dropout: float = 0.0, dropout_ctx=None
    ) -> torch.nn.Module:
        """A module computing the case's attention (what the compile suite compiles); ``scale``
        None asks for the implementation's default (dqk ** -0.5); ``dropout`` is the attention
        dropout probability in training mode (adapters with the ``dropout`` capability only);
        ``dropout_ctx``, when given, a callable returning the context manager dropout must run
        in (TE's ``attention_dropout_ctx``; adapters with ``dropout_ctx`` only)."""
        raise NotImplementedError

    def fp8_recipe(self, recipe):
        """What the implementation's ``fp8_meta={"recipe": ...}`` takes for a suite's recipe
        (adapters with the ``fp8`` capability). The suites describe recipes as
        te_ref.fp8.DelayedScaling or CurrentScaling, with Transformer Engine's field names:
        ``fp8_format`` ("E4M3", "E5M2", "HYBRID"), and for DelayedScaling ``margin``,
        ``amax_history_len``, ``amax_compute_algo``. The default passes the recipe on as it is."""
        return recipe

    def read_fp8_state(self, module) -> dict[str, FP8RoleState]:
        """Adapters with the ``fp8_state`` capability: ``module``'s FP8 scaling state after its
        last forward and backward pass in FP8, one FP8RoleState per role of FP8_ROLES."""
        raise NotImplementedError(f"{self.name} declares fp8_state but has no read_fp8_state")

    def call(self, module, case: AttnCase, q, k, v, kwargs: dict):
        """(out, max_logit or None, {leaf name: tensor that stands in for that leaf})."""
        result = module(q, k, v, **kwargs)
        out, max_logit = result if case.return_max_logit else (result, None)
        return out, max_logit, {}

    def run(self, case: AttnCase, q, k, v, kwargs: dict, scale: float):
        """One eager call on a fresh module."""
        return self.call(self.build(case, scale), case, q, k, v, kwargs)


class OpAdapter:
    """One implementation of te_fast's op table (te_fast/_registry.py) judged at the op level:
    its ``name``, the registry's public op names it implements (``ops``), why it cannot run
    here (``unavailable_reason``), why it turns a call away (``declines``), and the ops
    themselves. TE's fused softmax kernels are one (suites/adapters/te_kernels.py); te_fast's own
    ops are called directly by its own suites (suites/te_fast/)."""

    name = "?"
    ops: tuple[str, ...] = ()

    def unavailable_reason(self, device: str) -> str | None:
        return None

    def declines(self, op: str, x_shape, dtype, mask_shape=None, backward=False) -> list[Reason]:
        """Why the implementation does not run ``op`` on these shapes (empty: it does)."""
        return []

    def forward(self, op: str, x: torch.Tensor, *args) -> torch.Tensor:
        """The forward of ``op``: (x, scale) or (x, mask, scale)."""
        raise NotImplementedError

    def backward(self, op: str, dy: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        raise NotImplementedError
