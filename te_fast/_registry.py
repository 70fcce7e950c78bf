"""The te_fast op registry: one row per op, from which ops.py and the suites derive their parts."""

from __future__ import annotations

from dataclasses import dataclass

# Kinds: how an op is called, faked, differentiated and exercised by the suites.
SOFTMAX_FWD = "softmax_fwd"  # (x[, mask], scale) -> y
SOFTMAX_BWD = "softmax_bwd"  # (dy, y, scale) -> dx
THD_TO_BSHD = "thd_to_bshd"  # (thd, cu_seqlens, batch_size, max_seqlen) -> bshd
BSHD_TO_THD = "bshd_to_thd"  # (bshd, cu_seqlens, num_tokens) -> thd

SOFTMAX_4D = "[b, h, sq, sk]"
SOFTMAX_3D = "[attn_batches, sq, sk]"


@dataclass(frozen=True)
class OpSpec:
    """One op of torch.ops.te_fast. Its schema and kernels are in csrc/op_list.h.

    name: the op; kind: one of the kinds above; layout: the shape of its first tensor argument as
    messages write it; backward: the te_fast op that its autograd formula calls; masked: a softmax
    forward that takes a bool mask [1|b, 1, sq, sk] (True = masked out) after x.
    """

    name: str
    kind: str
    layout: str
    backward: str
    masked: bool = False

    @property
    def public(self) -> str:
        """The typed wrapper te_fast.ops.<public> (for a forward op also te_ref.<public>)."""
        return self.name.removesuffix("_fwd")

    @property
    def rank(self) -> int:
        """The rank of the first tensor argument."""
        return self.layout.count(",") + 1

    @property
    def is_softmax(self) -> bool:
        return self.kind in (SOFTMAX_FWD, SOFTMAX_BWD)


def _softmax(name: str, layout: str, masked: bool = False) -> tuple[OpSpec, OpSpec]:
    """A softmax pair: <name>_fwd and <name>_bwd, whose autograd both call <name>_bwd."""
    bwd = f"{name}_bwd"
    return (
        OpSpec(f"{name}_fwd", SOFTMAX_FWD, layout, bwd, masked),
        OpSpec(bwd, SOFTMAX_BWD, layout, bwd),
    )


OPS: tuple[OpSpec, ...] = (
    *_softmax("scaled_softmax", SOFTMAX_4D),
    *_softmax("scaled_masked_softmax", SOFTMAX_4D, masked=True),
    *_softmax("scaled_upper_triang_masked_softmax", SOFTMAX_3D),
    *_softmax("scaled_aligned_causal_masked_softmax", SOFTMAX_4D),
    OpSpec("convert_thd_to_bshd", THD_TO_BSHD, "[t, h, d]", "convert_bshd_to_thd"),
    OpSpec("convert_bshd_to_thd", BSHD_TO_THD, "[b, s, h, d]", "convert_thd_to_bshd"),
)

BY_NAME: dict[str, OpSpec] = {op.name: op for op in OPS}
OP_NAMES: tuple[str, ...] = tuple(BY_NAME)
