"""One support declaration per adapter (``Adapter.support``), and the one helper that applies it.

An adapter says, as data, what its implementation takes: the values of each case axis
(devices, dtypes, layouts, mask types, bias types, softmax types), the optional forward
arguments and outputs, the capabilities beyond computing a case (dropout, tracing, CUDA graphs,
FP8, ...), on which devices a capability holds, the combinations it turns away (``rules``) and
why it lacks each thing it lacks (``why``). ``Support.declines`` answers "can you take this
case, with these needs, and if not, why" (xformers' not_supported_reasons), each reason tagged
with the feature it concerns (suites/features.py); ``ready`` (suites/adapters/__init__.py) turns
the answer into the test's device or a skip recorded with its kind (suites/skips.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from te_conformance.suites import features
from te_conformance.suites.skips import Reason
from te_ref.layouts import ATTN_MASK_TYPES, BIAS_TYPES, LAYOUTS, SOFTMAX_TYPES

# What an implementation can do beyond computing a case (Support.capabilities), with the
# feature a test that needs it is about. A test that needs one runs through every selected
# adapter and skips, with the adapter's reason, where the adapter does not declare it.
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
    "exact_one_key": "a query row that keeps exactly one key gives that key's value row bit for "
    "bit (probability exactly 1.0: suites/checks/one_key.py)",
    "reference_messages": "its argument errors carry te_ref's (TE's) messages word for word "
    "(the module fuzz compares them)",
    "fp8": "FP8 attention with a scaling recipe (fp8=True, fp8_meta={'recipe': ...}), SPEC §5",
    "fp8_state": "FP8 scaling state readable after a pass (read_fp8_state): each role's amax "
    "history, the scale it quantized with and the next scale",
}
CAPABILITY_FEATURES = {
    "dropout": "dropout", "dropout_ctx": "dropout", "validates_arguments": "argument_checks",
    "traceable": "compile", "capturable": "cuda_graphs", "sync_free": "no_host_sync",
    "deterministic": "determinism", "fp8": "fp8", "fp8_state": "fp8", "exact_one_key": None,
    "reference_messages": "argument_checks",
}  # fmt: skip
# The optional forward arguments (Support.arguments): a case that passes one skips, with a
# reason, on an adapter that does not take it (instead of a TypeError).
ARGUMENTS = {
    "window_size": "window_size (a sliding window)",
    "bottom_right_diagonal": "bottom_right_diagonal (an alignment override)",
    "alibi_slopes": "alibi_slopes (user ALiBi slopes; without them, the default slopes)",
    "softmax_offset": "softmax_offset (the learnable softmax's [h] forward argument)",
    "cu_seqlens_padding": "cu_seqlens_q/cu_seqlens_kv on sbhd/bshd (padding lengths)",
    "padding_mask": "attention_mask as a padding mask (padding types on sbhd/bshd)",
}
# The optional outputs (Support.outputs): a case that asks for one runs without it where the
# adapter does not return it, every other tensor judged (suites/checks/coverage.py).
OUTPUTS = {"max_logit": "max_logit (return_max_logit=True)"}
AXES = ("devices", "dtypes", "layouts", "mask_types", "bias_types", "softmax_types")


@dataclass(frozen=True)
class Rule:
    """A combination the adapter turns away beyond its value lists: ``when(case)`` is True for
    a case it cannot take, ``reason`` says why, ``feature`` is the feature it concerns."""

    when: Callable
    reason: str
    feature: str | None = None


@dataclass(frozen=True)
class Support:
    """What an adapter's implementation takes, as data (docs/adapters.md). ``capabilities``:
    names of CAPABILITIES it has (on every device, unless ``capability_devices`` names the only
    devices where it holds); ``arguments`` and ``outputs``: the optional forward arguments
    (ARGUMENTS) and outputs (OUTPUTS) it takes; ``rules``: the combinations it turns away;
    ``why``: for anything it lacks (a value, an argument, an output, a capability), the
    reason shown with the skip."""

    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    layouts: tuple[str, ...] = tuple(LAYOUTS)
    mask_types: tuple[str, ...] = ATTN_MASK_TYPES
    bias_types: tuple[str, ...] = BIAS_TYPES
    softmax_types: tuple[str, ...] = SOFTMAX_TYPES
    arguments: tuple[str, ...] = tuple(ARGUMENTS)
    outputs: tuple[str, ...] = tuple(OUTPUTS)
    capabilities: tuple[str, ...] = ("traceable", "exact_one_key")
    capability_devices: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {"exact_one_key": ("cpu",)}
    )
    rules: tuple[Rule, ...] = ()
    why: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        for name, allowed in (("capabilities", CAPABILITIES), ("arguments", ARGUMENTS),
                              ("outputs", OUTPUTS), ("capability_devices", CAPABILITIES)):
            unknown = sorted(set(getattr(self, name)) - set(allowed))
            if unknown:
                raise ValueError(f"Support({name}=...): unknown {unknown}; known: "
                                 f"{sorted(allowed)}")  # fmt: skip

    def takes(self, name: str) -> bool:
        """Whether it takes the optional argument or output ``name``."""
        return name in self.arguments or name in self.outputs

    def has(self, capability: str, device: str | None = None) -> bool:
        """Whether it has ``capability`` (on ``device``, a device type, when given)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}; known: {sorted(CAPABILITIES)}")
        only = self.capability_devices.get(capability)
        return capability in self.capabilities and (
            device is None or only is None or device in only
        )

    def _because(self, key: str) -> str:
        why = self.why.get(key)
        return f": {why}" if why else ""

    def lacks(self, name: str, capability: str, device: str | None = None) -> Reason | None:
        """Why the adapter ``name`` cannot run a test that needs ``capability`` (on
        ``device``), or None."""
        if self.has(capability, device):
            return None
        what = CAPABILITIES[capability]
        on = "" if capability not in self.capabilities else f" on {device}"
        why = self._because(capability) or (
            f": declared for {', '.join(self.capability_devices[capability])} only" if on else
            ": not declared by the adapter"
        )  # fmt: skip
        return Reason(f"{name} lacks {capability}{on} ({what}){why}",
                      CAPABILITY_FEATURES[capability])  # fmt: skip

    def declines(
        self, name: str, case=None, needs=(), device: str | None = None, ignore=()
    ) -> list[Reason]:
        """Why the adapter ``name`` cannot run ``case`` (an AttnCase; None: no case) with the
        capabilities ``needs`` on ``device`` (default: the case's), leaving out the AXES named
        in ``ignore`` (a test of a call the standard refuses asks no mask type's support);
        empty when it can."""
        device = device or getattr(case, "device", None)
        found = [r for r in (self.lacks(name, c, device) for c in needs) if r]
        if case is None:
            return found
        layout_feature = features.layout_feature(case.layout)
        for axis, value, feature in (
            ("devices", case.device, None), ("dtypes", case.dtype, None),
            ("layouts", case.layout, layout_feature),
            ("mask_types", case.mask_type, f"mask_{case.mask_type}"),
            ("bias_types", case.bias_type, case.bias_type),
            ("softmax_types", case.softmax_type, f"softmax_{case.softmax_type}"),
        ):  # fmt: skip
            if value not in getattr(self, axis) and axis not in ignore:
                what = axis[:-1].replace("_", " ")
                found.append(Reason(f"{name} does not support {what} {value!r}"
                                    f"{self._because(value)}", feature))  # fmt: skip
        for arg, feature in self.passed_arguments(case):
            if arg not in self.arguments:
                found.append(Reason(f"{name} takes no {ARGUMENTS[arg]}{self._because(arg)}",
                                    feature))  # fmt: skip
        if case.return_max_logit and "max_logit" not in self.outputs:
            found.append(Reason(f"{name} does not return max_logit{self._because('max_logit')}",
                                "max_logit"))  # fmt: skip
        found += [Reason(f"{name}: {r.reason}", r.feature) for r in self.rules if r.when(case)]
        return found

    @staticmethod
    def passed_arguments(case) -> list[tuple[str, str]]:
        """(optional argument, the feature it is about) of each the case passes."""
        padded = case.mask_type.startswith("padding") and case.layout_info.q_format != "thd"
        mask = f"mask_{case.mask_type}"
        passed = (
            ("window_size", "window", case.window is not None),
            ("bottom_right_diagonal", "bottom_right_diagonal",
             case.bottom_right_diagonal is not None),
            ("alibi_slopes", "alibi", case.bias_type == "alibi" and case.alibi_slopes is not None),
            ("softmax_offset", "softmax_learnable", case.softmax_type == "learnable"),
            ("cu_seqlens_padding", mask, padded and case.padding_from == "cu_seqlens"),
            ("padding_mask", mask, padded and case.padding_from != "cu_seqlens"),
        )  # fmt: skip
        return [(arg, feature) for arg, feature, yes in passed if yes]
