"""The te_fast op registry: one row per op, from which ops.py and the suites derive their parts."""

from __future__ import annotations

from dataclasses import dataclass

# Kinds: how an op is called, faked, differentiated and exercised by the suites.
SOFTMAX_FWD = "softmax_fwd"  # (x[, mask], scale) -> y
SOFTMAX_BWD = "softmax_bwd"  # (dy, y, scale) -> dx
THD_TO_BSHD = "thd_to_bshd"  # (thd, cu_seqlens, batch_size, max_seqlen) -> bshd
BSHD_TO_THD = "bshd_to_thd"  # (bshd, cu_seqlens, num_tokens) -> thd

# Mask modes: the enumerators of te_fast_rules::MaskMode (csrc/rules.h), as op_list.h names them.
NO_MASK = "kNoMask"
EXPLICIT_MASK = "kExplicitMask"  # bool mask [1|b, 1, sq, sk] after x, True = masked out
TOP_LEFT_CAUSAL = "kTopLeftCausal"  # keep j <= i
BOTTOM_RIGHT_CAUSAL = "kBottomRightCausal"  # keep j <= i + (sk - sq)
# The modes whose kept columns follow from the shape: a backward in one of them reads only each
# row's kept prefix.
CAUSAL_MODES = (TOP_LEFT_CAUSAL, BOTTOM_RIGHT_CAUSAL)

SOFTMAX_4D = "[b, h, sq, sk]"
SOFTMAX_3D = "[attn_batches, sq, sk]"


@dataclass(frozen=True)
class OpSpec:
    """One op of torch.ops.te_fast defined in C++: a row of TE_FAST_OPS in csrc/op_list.h, which
    generates its schema and kernel registrations (tests/test_op_table.py checks that both lists
    agree: names, order, entry, mask mode, rank).

    name: the op; kind: one of the kinds above; layout: the shape of its first tensor argument as
    messages write it (its rank is op_list.h's); backward: the te_fast op that its autograd formula
    calls; entry: its OpTable<Backend> entry point (csrc/op_table.h), whose schema is
    TE_FAST_SCHEMA_<entry>; mask_mode: the MaskMode of a softmax op (a backward's is its
    forward's causal mode, else NO_MASK), NO_MASK for the others.
    """

    name: str
    kind: str
    layout: str
    backward: str
    entry: str
    mask_mode: str = NO_MASK

    @property
    def public(self) -> str:
        """The typed wrapper te_fast.ops.<public> (for a forward op also te_ref.<public>)."""
        return self.name.removesuffix("_fwd")

    @property
    def rank(self) -> int:
        """The rank of the first tensor argument."""
        return self.layout.count(",") + 1

    @property
    def masked(self) -> bool:
        """A softmax forward that takes a bool mask [1|b, 1, sq, sk] (True = masked out) after x."""
        return self.mask_mode == EXPLICIT_MASK

    @property
    def causal(self) -> bool:
        """A causal mode: the kept columns of row i are a prefix that follows from (i, sq, sk)."""
        return self.mask_mode in CAUSAL_MODES

    @property
    def is_softmax(self) -> bool:
        return self.kind in (SOFTMAX_FWD, SOFTMAX_BWD)


def _softmax(name: str, entry: str, mask_mode: str, layout: str) -> tuple[OpSpec, OpSpec]:
    """A softmax pair, as op_list.h's TE_FAST_SOFTMAX declares it: <name>_fwd (``entry``,
    ``mask_mode``) and <name>_bwd (entry softmax_bwd), whose autograd both call <name>_bwd.
    The backward keeps a causal mode (it reads only each row's kept prefix of dy and y and
    writes +0 past it, docs/SPEC.md §3); an explicit mask's backward takes no mask: NO_MASK."""
    bwd = f"{name}_bwd"
    bwd_mode = mask_mode if mask_mode in CAUSAL_MODES else NO_MASK
    return (
        OpSpec(f"{name}_fwd", SOFTMAX_FWD, layout, bwd, entry, mask_mode),
        OpSpec(bwd, SOFTMAX_BWD, layout, bwd, "softmax_bwd", bwd_mode),
    )


# The C++ ops, in op_list.h's order. Every consumer of OPS (the loader's check of _C, the fakes
# and autograd of ops.py, the op suites) means exactly these: kernels in csrc/.
OPS: tuple[OpSpec, ...] = (
    *_softmax("scaled_softmax", "softmax_fwd", NO_MASK, SOFTMAX_4D),
    *_softmax("scaled_masked_softmax", "masked_softmax_fwd", EXPLICIT_MASK, SOFTMAX_4D),
    *_softmax("scaled_upper_triang_masked_softmax", "softmax_fwd", TOP_LEFT_CAUSAL, SOFTMAX_3D),
    *_softmax(
        "scaled_aligned_causal_masked_softmax", "softmax_fwd", BOTTOM_RIGHT_CAUSAL, SOFTMAX_4D
    ),
    OpSpec("convert_thd_to_bshd", THD_TO_BSHD, "[t, h, d]", "convert_bshd_to_thd", "thd_to_bshd"),
    OpSpec(
        "convert_bshd_to_thd", BSHD_TO_THD, "[b, s, h, d]", "convert_thd_to_bshd", "bshd_to_thd"
    ),
)

BY_NAME: dict[str, OpSpec] = {op.name: op for op in OPS}
OP_NAMES: tuple[str, ...] = tuple(BY_NAME)  # the ops that te_fast._C must define

# The te_fast softmax kinds (a forward op's name less "_fwd"), as the attention core takes them
# by name, and the softmax forward of each mask mode.
SOFTMAX_KINDS: tuple[str, ...] = tuple(op.public for op in OPS if op.kind == SOFTMAX_FWD)
SOFTMAX_BY_MASK_MODE: dict[str, OpSpec] = {op.mask_mode: op for op in OPS if op.kind == SOFTMAX_FWD}


# ----------------------------------------------------------------------------- Python-defined ops


@dataclass(frozen=True)
class PythonOpSpec:
    """One op of torch.ops.te_fast defined in Python: te_fast/_attention_core.py defines it from
    this row (its kernels, one for CPU and CUDA, are that module's functions), not _C. Apart from
    OPS on purpose: no op_list.h row, no fake or autograd builder by kind in ops.py, no case in
    the kernel-op suites (suites/te_fast/test_eager_core.py covers these).

    name: the op (and its typed wrapper te_fast.ops.<name>); schema: its arguments and result,
    as torch.library.define takes them after the name; backward: the te_fast op that its autograd
    calls (None: no derivative); tags: torch.Tag names, those the running torch lacks skipped.
    """

    name: str
    schema: str
    backward: str | None
    tags: tuple[str, ...] = ()

    @property
    def public(self) -> str:
        return self.name


# The attention core as traces see it. Schema notes:
# - softmax is a SOFTMAX_KINDS string (op arguments cannot be callables);
# - the slices are ``axis`` and ``edges`` ([0, ..., b or h]), computed once by chunk_bounds where
#   the call is traced and passed to the forward op, its fake, the backward op and its fake
#   alike, so the number of slices (a list length, fixed in the graph) cannot disagree between
#   them; with dynamic shapes the edges are SymInt expressions of the sizes (and the count is
#   guarded), evaluated again on each call;
# - the probabilities come back as one tensor per slice (never concatenated: that would be a
#   copy as large as P), non-differentiable, to be passed back to the backward op;
# - needs_exact_strides: the outputs are laid out as q (dq/dk/dv as q/k/v) are, so a compiler
#   must hand the ops their inputs with the strides the fakes saw (inductor's default for custom
#   ops today, stated here because correctness depends on it);
# - the backward's unneeded gradients are None (``Tensor?``), like aten's output_mask ops; it
#   takes the softmax kind too, so that a causal kind's backward reads only the kept prefix.
PYTHON_OPS: tuple[PythonOpSpec, ...] = (
    PythonOpSpec(
        "attention_core",
        "(Tensor q, Tensor k, Tensor v, Tensor? mask, str softmax, float scale, int axis, "
        "SymInt[] edges, bool keep_probs) -> (Tensor, Tensor[])",
        "attention_core_backward",
        ("needs_exact_strides",),
    ),
    PythonOpSpec(
        "attention_core_backward",
        "(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor[] probs, str softmax, "
        "float scale, int axis, SymInt[] edges, bool[3] output_mask) "
        "-> (Tensor?, Tensor?, Tensor?)",
        None,
        ("needs_exact_strides",),
    ),
)

PYTHON_BY_NAME: dict[str, PythonOpSpec] = {op.name: op for op in PYTHON_OPS}
