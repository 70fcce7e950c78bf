"""te_fast operators: typed wrappers over torch.ops.te_fast; fakes and autograd from _registry."""

from __future__ import annotations

import torch

from te_fast import _registry as reg
from te_fast._loader import UNAVAILABLE_REASON

# the C++ ops (fakes and autograd below) and the Python-defined ones (te_fast/_attention_core.py)
__all__ = [op.public for op in (*reg.OPS, *reg.PYTHON_OPS)]

_SOFTMAX_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_STORAGE_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)


def _ops():
    if UNAVAILABLE_REASON is not None:
        raise RuntimeError(UNAVAILABLE_REASON)
    return torch.ops.te_fast


# ----------------------------------------------------------------------------- public wrappers


def scaled_softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * x) over the last dim. x: [b, h, sq, sk] fp16/bf16/fp32 -> same shape."""
    return _ops().scaled_softmax_fwd.default(x, scale)


def scaled_masked_softmax(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Masked softmax. x: [b, h, sq, sk]; mask: bool [1|b, 1, sq, sk], True = masked out.

    Masked positions get exactly 0; a row with every column masked is all 0.
    """
    return _ops().scaled_masked_softmax_fwd.default(x, mask, scale)


def scaled_upper_triang_masked_softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Top-left causal softmax (keep j <= i). x: [attn_batches, sq, sk] -> same shape."""
    return _ops().scaled_upper_triang_masked_softmax_fwd.default(x, scale)


def scaled_aligned_causal_masked_softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Bottom-right causal softmax (keep j <= i + sk - sq). x: [b, h, sq, sk] -> same shape.

    With sq > sk the first sq - sk rows are fully masked, hence 0.
    """
    return _ops().scaled_aligned_causal_masked_softmax_fwd.default(x, scale)


def scaled_softmax_bwd(dy: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    """dx = scale * y * (dy - sum_j dy_j y_j). dy, y: [b, h, sq, sk] -> dx of the same shape."""
    return _ops().scaled_softmax_bwd.default(dy, y, scale)


def scaled_masked_softmax_bwd(dy: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    """Backward of scaled_masked_softmax (masked y are 0, so no mask is needed). [b, h, sq, sk]."""
    return _ops().scaled_masked_softmax_bwd.default(dy, y, scale)


def scaled_upper_triang_masked_softmax_bwd(
    dy: torch.Tensor, y: torch.Tensor, scale: float
) -> torch.Tensor:
    """Backward of scaled_upper_triang_masked_softmax. dy, y: [attn_batches, sq, sk]."""
    return _ops().scaled_upper_triang_masked_softmax_bwd.default(dy, y, scale)


def scaled_aligned_causal_masked_softmax_bwd(
    dy: torch.Tensor, y: torch.Tensor, scale: float
) -> torch.Tensor:
    """Backward of scaled_aligned_causal_masked_softmax. dy, y: [b, h, sq, sk]."""
    return _ops().scaled_aligned_causal_masked_softmax_bwd.default(dy, y, scale)


def convert_thd_to_bshd(
    thd: torch.Tensor, cu_seqlens: torch.Tensor, batch_size: int, max_seqlen: int
) -> torch.Tensor:
    """Ragged [t, h, d] -> zero-padded [batch_size, max_seqlen, h, d].

    cu_seqlens: int32 [batch_size + 1], cu_seqlens[0] == 0, non-decreasing, each sequence no longer
    than max_seqlen, cu_seqlens[-1] <= t. batch_size and max_seqlen are plain ints (never read from
    a device tensor). Any float dtype, fp8 storage included.
    """
    return _ops().convert_thd_to_bshd.default(thd, cu_seqlens, batch_size, max_seqlen)


def convert_bshd_to_thd(
    bshd: torch.Tensor, cu_seqlens: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Padded [b, s, h, d] -> ragged [num_tokens, h, d]; rows past cu_seqlens[-1] are 0.

    cu_seqlens: int32 [b + 1]; num_tokens is a plain int (never read from a device tensor).
    """
    return _ops().convert_bshd_to_thd.default(bshd, cu_seqlens, num_tokens)


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    softmax: str,
    scale: float,
    axis: int,
    edges: list[int],
    keep_probs: bool,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """softmax(scale * q k^T) v, slice by slice: UnfusedDotProductAttention's core as traces see
    it (defined in te_fast/_attention_core.py, its kernels the eager core's own code).

    q [b, h, sq, d], k [b, h, skv, d], v [b, h, skv, dv] (any strides, one dtype); softmax: the
    te_fast softmax (a forward op's name less "_fwd", te_fast._registry.SOFTMAX_KINDS); mask: bool,
    broadcastable to [b, h, sq, skv], True = masked out, with "scaled_masked_softmax" only;
    axis 0 (batch) or 1 (heads) and edges [0, ..., q.shape[axis]]: the slices [edges[i],
    edges[i + 1]). Returns o [b, h, sq, dv], laid out in memory as q is, and with keep_probs the
    probabilities of each slice ([hi - lo, h, sq, skv] or [b, hi - lo, sq, skv], contiguous),
    which attention_core_backward takes (keep_probs=False: [], no backward).
    """
    return _ops().attention_core.default(q, k, v, mask, softmax, scale, axis, edges, keep_probs)


def attention_core_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    probs: list[torch.Tensor],
    softmax: str,
    scale: float,
    axis: int,
    edges: list[int],
    output_mask: list[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dq, dk, dv) of attention_core from grad_out [b, h, sq, dv] and the probabilities it
    returned for the softmax kind ``softmax``, slice by slice; each laid out in memory as its
    input is, None where output_mask (three bools) says no. No double backward."""
    return _ops().attention_core_backward.default(
        grad_out, q, k, v, probs, softmax, scale, axis, edges, output_mask
    )


_missing = [name for name in __all__ if name not in globals()]
if _missing:  # a row of te_fast/_registry.py without its typed wrapper above
    raise ImportError(f"te_fast.ops lacks the typed wrappers {_missing}")


# ----------------------------------------------------------------------------- fakes


def _check_tensor(
    op: str, name: str, t: torch.Tensor, dim: int, shape: str, dtypes: tuple, dtype_words: str
) -> None:
    torch._check(
        t.dim() == dim,
        lambda: f"te_fast: {op} expects {name} of shape {shape}, got {tuple(t.shape)}",
    )
    torch._check(
        t.dtype in dtypes,
        lambda: f"te_fast: {op} expects {name} of {dtype_words}, got {t.dtype}",
    )


def _check_softmax_input(spec: reg.OpSpec, name: str, x: torch.Tensor) -> None:
    shape = f"{spec.layout} ({spec.rank}-D)"
    words = "dtype float16, bfloat16 or float32"
    _check_tensor(spec.name, name, x, spec.rank, shape, _SOFTMAX_DTYPES, words)


def _check_storage(spec: reg.OpSpec, name: str, t: torch.Tensor) -> None:
    _check_tensor(spec.name, name, t, spec.rank, spec.layout, _STORAGE_DTYPES, "a float dtype")


def _check_mask(op: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    torch._check(mask.dtype == torch.bool, lambda: f"te_fast: {op} expects a bool mask")
    torch._check(
        mask.dim() == 4
        and (mask.shape[0] == 1 or mask.shape[0] == x.shape[0])
        and mask.shape[1] == 1
        and mask.shape[2] == x.shape[2]
        and mask.shape[3] == x.shape[3],
        lambda: (
            f"te_fast: {op} expects mask of shape [1|b, 1, sq, sk] for x of shape "
            f"{tuple(x.shape)}, got {tuple(mask.shape)}"
        ),
    )


def _check_cu_seqlens(op: str, cu_seqlens: torch.Tensor, batch: int) -> None:
    torch._check(
        cu_seqlens.dtype == torch.int32,
        lambda: f"te_fast: {op} expects cu_seqlens of dtype int32, got {cu_seqlens.dtype}",
    )
    torch._check(
        cu_seqlens.dim() == 1 and cu_seqlens.shape[0] == batch + 1,
        lambda: (
            f"te_fast: {op} expects cu_seqlens of shape [{batch} + 1], got "
            f"{tuple(cu_seqlens.shape)}"
        ),
    )


def _fake_softmax_fwd(spec: reg.OpSpec):
    def fake(x, scale):
        _check_softmax_input(spec, "x", x)
        return x.new_empty(x.shape)

    def fake_masked(x, mask, scale):
        _check_softmax_input(spec, "x", x)
        _check_mask(spec.name, x, mask)
        return x.new_empty(x.shape)

    return fake_masked if spec.masked else fake


def _fake_softmax_bwd(spec: reg.OpSpec):
    op = spec.name

    def fake(dy, y, scale):
        _check_softmax_input(spec, "y", y)
        torch._check(
            dy.shape == y.shape,
            lambda: (
                f"te_fast: {op} expects dy of the same shape as y {tuple(y.shape)}, got "
                f"{tuple(dy.shape)}"
            ),
        )
        torch._check(
            dy.dtype == y.dtype,
            lambda: f"te_fast: {op} expects dy of the same dtype as y ({y.dtype}), got {dy.dtype}",
        )
        return y.new_empty(y.shape)

    return fake


def _fake_thd_to_bshd(spec: reg.OpSpec):
    def fake(thd, cu_seqlens, batch_size, max_seqlen):
        _check_storage(spec, "thd", thd)
        _check_cu_seqlens(spec.name, cu_seqlens, batch_size)
        return thd.new_empty((batch_size, max_seqlen, thd.shape[1], thd.shape[2]))

    return fake


def _fake_bshd_to_thd(spec: reg.OpSpec):
    def fake(bshd, cu_seqlens, num_tokens):
        _check_storage(spec, "bshd", bshd)
        _check_cu_seqlens(spec.name, cu_seqlens, bshd.shape[0])
        return bshd.new_empty((num_tokens, bshd.shape[2], bshd.shape[3]))

    return fake


# ----------------------------------------------------------------------------- autograd
# One (backward, setup_context) builder per kind; the backward calls the op's `backward` op.


def _backward_op(spec: reg.OpSpec):
    return getattr(torch.ops.te_fast, spec.backward).default


def _autograd_softmax_fwd(spec: reg.OpSpec):
    n_inputs = 3 if spec.masked else 2

    def setup_context(ctx, inputs, output):
        ctx.scale = inputs[-1]
        ctx.save_for_backward(output)

    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        dx = _backward_op(spec)(grad, y, ctx.scale)
        return (dx,) + (None,) * (n_inputs - 1)

    return backward, setup_context


def _kept(spec: reg.OpSpec, y: torch.Tensor) -> torch.Tensor | None:
    """The columns a causal backward reads, bool [sq, sk] (True = kept): j < kept_prefix(i) as
    csrc/rules.h has it; None for a backward that reads whole rows."""
    if not spec.causal:
        return None
    sq, sk = y.shape[-2], y.shape[-1]
    i = torch.arange(sq, device=y.device).view(sq, 1)
    j = torch.arange(sk, device=y.device).view(1, sk)
    return j <= i + (sk - sq if spec.mask_mode == reg.BOTTOM_RIGHT_CAUSAL else 0)


def _autograd_softmax_bwd(spec: reg.OpSpec):
    def setup_context(ctx, inputs, output):
        dy, y, scale = inputs
        ctx.scale = scale
        ctx.save_for_backward(dy, y)

    # dx = c * y * (dy - s), s = sum(dy * y). For an incoming gradient g of dx:
    #   d/d(dy) = c * y * (g - r), r = sum(g * y)        -> the same te_fast backward op
    #   d/d(y)  = c * (g * (dy - s) - dy * r)             -> fp32 composite (double backward only)
    # A causal backward reads dy and y only in each row's kept prefix (SPEC §3): dx does not depend
    # on them past it, so both derivatives are +0 there (the op itself gives that for d/d(dy); the
    # composite takes the kept columns alone).
    def backward(ctx, g):
        dy, y = ctx.saved_tensors
        grad_dy = grad_y = None
        if ctx.needs_input_grad[0]:
            grad_dy = _backward_op(spec)(g, y, ctx.scale)
        if ctx.needs_input_grad[1]:
            g32, dy32, y32 = g.float(), dy.float(), y.float()
            kept = _kept(spec, y)
            if kept is not None:
                g32, dy32, y32 = (t.where(kept, 0.0) for t in (g32, dy32, y32))
            s = (dy32 * y32).sum(-1, keepdim=True)
            r = (g32 * y32).sum(-1, keepdim=True)
            grad_y = ctx.scale * (g32 * (dy32 - s) - dy32 * r)
            if kept is not None:
                grad_y = grad_y.where(kept, 0.0)
            grad_y = grad_y.to(y.dtype)
        return grad_dy, grad_y, None

    return backward, setup_context


def _autograd_thd_to_bshd(spec: reg.OpSpec):
    def setup_context(ctx, inputs, output):
        thd, cu_seqlens, _, _ = inputs
        ctx.num_tokens = thd.shape[0]
        ctx.save_for_backward(cu_seqlens)

    def backward(ctx, grad):
        (cu_seqlens,) = ctx.saved_tensors
        return _backward_op(spec)(grad, cu_seqlens, ctx.num_tokens), None, None, None

    return backward, setup_context


def _autograd_bshd_to_thd(spec: reg.OpSpec):
    def setup_context(ctx, inputs, output):
        bshd, cu_seqlens, _ = inputs
        ctx.batch_size, ctx.seqlen = bshd.shape[0], bshd.shape[1]
        ctx.save_for_backward(cu_seqlens)

    def backward(ctx, grad):
        (cu_seqlens,) = ctx.saved_tensors
        return _backward_op(spec)(grad, cu_seqlens, ctx.batch_size, ctx.seqlen), None, None

    return backward, setup_context


_FAKES = {
    reg.SOFTMAX_FWD: _fake_softmax_fwd,
    reg.SOFTMAX_BWD: _fake_softmax_bwd,
    reg.THD_TO_BSHD: _fake_thd_to_bshd,
    reg.BSHD_TO_THD: _fake_bshd_to_thd,
}
_AUTOGRAD = {
    reg.SOFTMAX_FWD: _autograd_softmax_fwd,
    reg.SOFTMAX_BWD: _autograd_softmax_bwd,
    reg.THD_TO_BSHD: _autograd_thd_to_bshd,
    reg.BSHD_TO_THD: _autograd_bshd_to_thd,
}


def _register() -> None:
    for spec in reg.OPS:
        qualname = f"te_fast::{spec.name}"
        torch.library.register_fake(qualname, _FAKES[spec.kind](spec))
        backward, setup_context = _AUTOGRAD[spec.kind](spec)
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)


if UNAVAILABLE_REASON is None:
    _register()
