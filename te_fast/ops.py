"""te_fast operators: typed wrappers over torch.ops.te_fast, their fake impls and their autograd."""

from __future__ import annotations

import torch

from te_fast._loader import UNAVAILABLE_REASON

__all__ = [
    "scaled_softmax",
    "scaled_masked_softmax",
    "scaled_upper_triang_masked_softmax",
    "scaled_aligned_causal_masked_softmax",
    "convert_thd_to_bshd",
    "convert_bshd_to_thd",
    "scaled_softmax_bwd",
    "scaled_masked_softmax_bwd",
    "scaled_upper_triang_masked_softmax_bwd",
    "scaled_aligned_causal_masked_softmax_bwd",
]

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


# ----------------------------------------------------------------------------- fakes


def _check_softmax_input(op: str, name: str, x: torch.Tensor, dim: int, layout: str) -> None:
    torch._check(
        x.dim() == dim,
        lambda: f"te_fast: {op} expects {name} of shape {layout} ({dim}-D), got {tuple(x.shape)}",
    )
    torch._check(
        x.dtype in _SOFTMAX_DTYPES,
        lambda: (
            f"te_fast: {op} expects {name} of dtype float16, bfloat16 or float32, got {x.dtype}"
        ),
    )


def _check_softmax_bwd(op: str, dy: torch.Tensor, y: torch.Tensor, dim: int, layout: str) -> None:
    _check_softmax_input(op, "y", y, dim, layout)
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


def _check_storage(op: str, name: str, t: torch.Tensor, dim: int, layout: str) -> None:
    torch._check(
        t.dim() == dim,
        lambda: f"te_fast: {op} expects {name} of shape {layout}, got {tuple(t.shape)}",
    )
    torch._check(
        t.dtype in _STORAGE_DTYPES,
        lambda: f"te_fast: {op} expects {name} of a float dtype, got {t.dtype}",
    )


_4D = "[b, h, sq, sk]"
_3D = "[attn_batches, sq, sk]"


def _fake_softmax_fwd(op: str, dim: int, layout: str):
    def fake(x, scale):
        _check_softmax_input(op, "x", x, dim, layout)
        return x.new_empty(x.shape)

    return fake


def _fake_softmax_bwd(op: str, dim: int, layout: str):
    def fake(dy, y, scale):
        _check_softmax_bwd(op, dy, y, dim, layout)
        return y.new_empty(y.shape)

    return fake


def _fake_scaled_masked_softmax_fwd(x, mask, scale):
    op = "scaled_masked_softmax_fwd"
    _check_softmax_input(op, "x", x, 4, _4D)
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
    return x.new_empty(x.shape)


def _fake_convert_thd_to_bshd(thd, cu_seqlens, batch_size, max_seqlen):
    op = "convert_thd_to_bshd"
    _check_storage(op, "thd", thd, 3, "[t, h, d]")
    _check_cu_seqlens(op, cu_seqlens, batch_size)
    return thd.new_empty((batch_size, max_seqlen, thd.shape[1], thd.shape[2]))


def _fake_convert_bshd_to_thd(bshd, cu_seqlens, num_tokens):
    op = "convert_bshd_to_thd"
    _check_storage(op, "bshd", bshd, 4, "[b, s, h, d]")
    _check_cu_seqlens(op, cu_seqlens, bshd.shape[0])
    return bshd.new_empty((num_tokens, bshd.shape[2], bshd.shape[3]))


# ----------------------------------------------------------------------------- autograd


def _softmax_fwd_setup(ctx, inputs, output):
    ctx.scale = inputs[-1]
    ctx.save_for_backward(output)


def _softmax_fwd_backward(bwd_name: str, n_inputs: int):
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        dx = getattr(torch.ops.te_fast, bwd_name).default(grad, y, ctx.scale)
        return (dx,) + (None,) * (n_inputs - 1)

    return backward


def _softmax_bwd_setup(ctx, inputs, output):
    dy, y, scale = inputs
    ctx.scale = scale
    ctx.save_for_backward(dy, y)


def _softmax_bwd_backward(bwd_name: str):
    # dx = c * y * (dy - s), s = sum(dy * y). For an incoming gradient g of dx:
    #   d/d(dy) = c * y * (g - r), r = sum(g * y)        -> the same te_fast backward op
    #   d/d(y)  = c * (g * (dy - s) - dy * r)             -> fp32 composite (double backward only)
    def backward(ctx, g):
        dy, y = ctx.saved_tensors
        grad_dy = grad_y = None
        if ctx.needs_input_grad[0]:
            grad_dy = getattr(torch.ops.te_fast, bwd_name).default(g, y, ctx.scale)
        if ctx.needs_input_grad[1]:
            g32, dy32, y32 = g.float(), dy.float(), y.float()
            s = (dy32 * y32).sum(-1, keepdim=True)
            r = (g32 * y32).sum(-1, keepdim=True)
            grad_y = (ctx.scale * (g32 * (dy32 - s) - dy32 * r)).to(y.dtype)
        return grad_dy, grad_y, None

    return backward


def _thd_to_bshd_setup(ctx, inputs, output):
    thd, cu_seqlens, _, _ = inputs
    ctx.num_tokens = thd.shape[0]
    ctx.save_for_backward(cu_seqlens)


def _thd_to_bshd_backward(ctx, grad):
    (cu_seqlens,) = ctx.saved_tensors
    return (
        torch.ops.te_fast.convert_bshd_to_thd.default(grad, cu_seqlens, ctx.num_tokens),
        None,
        None,
        None,
    )


def _bshd_to_thd_setup(ctx, inputs, output):
    bshd, cu_seqlens, _ = inputs
    ctx.batch_size, ctx.seqlen = bshd.shape[0], bshd.shape[1]
    ctx.save_for_backward(cu_seqlens)


def _bshd_to_thd_backward(ctx, grad):
    (cu_seqlens,) = ctx.saved_tensors
    grad_bshd = torch.ops.te_fast.convert_thd_to_bshd.default(
        grad, cu_seqlens, ctx.batch_size, ctx.seqlen
    )
    return grad_bshd, None, None


_SOFTMAX_OPS = (
    # (forward op, backward op, rank, layout, forward inputs)
    ("scaled_softmax_fwd", "scaled_softmax_bwd", 4, _4D, 2),
    ("scaled_masked_softmax_fwd", "scaled_masked_softmax_bwd", 4, _4D, 3),
    ("scaled_upper_triang_masked_softmax_fwd", "scaled_upper_triang_masked_softmax_bwd", 3, _3D, 2),
    (
        "scaled_aligned_causal_masked_softmax_fwd",
        "scaled_aligned_causal_masked_softmax_bwd",
        4,
        _4D,
        2,
    ),
)


def _register() -> None:
    lib = torch.library
    for fwd, bwd, dim, layout, n_inputs in _SOFTMAX_OPS:
        if n_inputs == 2:
            lib.register_fake(f"te_fast::{fwd}", _fake_softmax_fwd(fwd, dim, layout))
        lib.register_fake(f"te_fast::{bwd}", _fake_softmax_bwd(bwd, dim, layout))
        lib.register_autograd(
            f"te_fast::{fwd}",
            _softmax_fwd_backward(bwd, n_inputs),
            setup_context=_softmax_fwd_setup,
        )
        lib.register_autograd(
            f"te_fast::{bwd}", _softmax_bwd_backward(bwd), setup_context=_softmax_bwd_setup
        )
    lib.register_fake("te_fast::scaled_masked_softmax_fwd", _fake_scaled_masked_softmax_fwd)
    lib.register_fake("te_fast::convert_thd_to_bshd", _fake_convert_thd_to_bshd)
    lib.register_fake("te_fast::convert_bshd_to_thd", _fake_convert_bshd_to_thd)
    lib.register_autograd(
        "te_fast::convert_thd_to_bshd", _thd_to_bshd_backward, setup_context=_thd_to_bshd_setup
    )
    lib.register_autograd(
        "te_fast::convert_bshd_to_thd", _bshd_to_thd_backward, setup_context=_bshd_to_thd_setup
    )


if UNAVAILABLE_REASON is None:
    _register()
