"""Reference versions of the te_fast ops (the softmax forwards and backwards, the two
conversions): plain PyTorch, differentiable, any compute dtype."""

from __future__ import annotations

import torch


def masked_softmax(scores: torch.Tensor, masked: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dim of the unmasked columns (masked: bool, True = masked out).

    Masked columns get exactly 0, and a row with every column masked (or -inf) is all 0.
    Runs in scores.dtype through torch.softmax: exact in float64; for fp16/bf16 it accumulates in
    fp32 and its backward uses the stored low-precision output, as any unfused implementation
    that materialises the probabilities must (this is the same-precision composite of SPEC §6).
    """
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # nothing to attend to
    probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)
    return probs.masked_fill(dead, 0.0)


def _softmax(x, scale, masked, compute_dtype):
    s = x.to(compute_dtype) * scale  # (..., sq, sk)
    return masked_softmax(s, masked)


def _causal_mask(sq: int, sk: int, offset: int, device) -> torch.Tensor:
    i = torch.arange(sq, device=device).view(sq, 1)
    j = torch.arange(sk, device=device).view(1, sk)
    return j > i + offset  # (sq, sk), True = masked


def scaled_softmax(x, scale, compute_dtype=torch.float64):
    """softmax(scale * x). x: [b, h, sq, sk]."""
    return _softmax(x, scale, None, compute_dtype)


def scaled_masked_softmax(x, mask, scale, compute_dtype=torch.float64):
    """softmax(scale * x) with mask bool [1|b, 1, sq, sk], True = masked out. x: [b, h, sq, sk]."""
    return _softmax(x, scale, mask, compute_dtype)


def scaled_upper_triang_masked_softmax(x, scale, compute_dtype=torch.float64):
    """Top-left causal (keep j <= i). x: [attn_batches, sq, sk]."""
    sq, sk = x.shape[-2], x.shape[-1]
    return _softmax(x, scale, _causal_mask(sq, sk, 0, x.device), compute_dtype)


def scaled_aligned_causal_masked_softmax(x, scale, compute_dtype=torch.float64):
    """Bottom-right causal (keep j <= i + sk - sq). x: [b, h, sq, sk]."""
    sq, sk = x.shape[-2], x.shape[-1]
    return _softmax(x, scale, _causal_mask(sq, sk, sk - sq, x.device), compute_dtype)


# ----------------------------------------------------------------------------- softmax backwards
# dx = scale * y * (dy - sum_j dy_j * y_j), the formula every softmax forward above has as its
# derivative, called on a given (dy, y) as the te_fast backward ops are (docs/SPEC.md §3). The
# causal ops' backwards take only each row's kept columns: past them dy and y are not read (they
# may hold anything, NaN included) and dx is +0. The explicitly masked op's backward takes no
# mask, so it reads whole rows (where its y is 0, dx is 0 but for a NaN or inf dy).


def softmax_backward(dy, y, scale, kept=None, compute_dtype=torch.float64):
    """scale * y * (dy - sum(dy * y)) over the last dim in compute_dtype, over the columns where
    ``kept`` (bool, broadcast to y; None: every column) is True; +0 elsewhere, where dy and y are
    not read."""
    dy, y = dy.to(compute_dtype), y.to(compute_dtype)
    if kept is None:
        return scale * y * (dy - (dy * y).sum(-1, keepdim=True))
    dy, y = dy.where(kept, 0.0), y.where(kept, 0.0)
    dx = scale * y * (dy - (dy * y).sum(-1, keepdim=True))
    return dx.where(kept, 0.0)


def kept_columns(op: str, sq: int, sk: int, device=None) -> torch.Tensor | None:
    """The columns that the backward of softmax ``op`` (a forward's name, e.g.
    "scaled_upper_triang_masked_softmax") reads: bool [sq, sk], True = kept; None for whole
    rows (the plain and explicitly masked softmax)."""
    if op == "scaled_upper_triang_masked_softmax":
        return ~_causal_mask(sq, sk, 0, device)
    if op == "scaled_aligned_causal_masked_softmax":
        return ~_causal_mask(sq, sk, sk - sq, device)
    if op in ("scaled_softmax", "scaled_masked_softmax"):
        return None
    raise ValueError(f"te_ref: no softmax op {op!r}")


def _backward_of(op: str):
    def backward(dy, y, scale, compute_dtype=torch.float64):
        kept = kept_columns(op, y.shape[-2], y.shape[-1], y.device)
        return softmax_backward(dy, y, scale, kept, compute_dtype)

    backward.__name__ = f"{op}_bwd"
    backward.__doc__ = f"The backward of {op} on a given (dy, y): softmax_backward over the " + (
        "kept columns (kept_columns)." if kept_columns(op, 1, 2) is not None else "whole rows."
    )
    return backward


scaled_softmax_bwd = _backward_of("scaled_softmax")
scaled_masked_softmax_bwd = _backward_of("scaled_masked_softmax")
scaled_upper_triang_masked_softmax_bwd = _backward_of("scaled_upper_triang_masked_softmax")
scaled_aligned_causal_masked_softmax_bwd = _backward_of("scaled_aligned_causal_masked_softmax")


def check_cu_seqlens(cu_seqlens, batch_size, num_tokens, max_len, what="max_seqlen"):
    """Host-side list of cu_seqlens after checking SPEC §3's rules; ValueError otherwise."""
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        raise ValueError(
            "cu_seqlens must be a 1-D int32 tensor, got "
            f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}"
        )
    if cu_seqlens.shape[0] != batch_size + 1:
        raise ValueError(
            f"cu_seqlens must have shape [{batch_size + 1}], got {tuple(cu_seqlens.shape)}"
        )
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens[0] must be 0, got {cu[0]}")
    for x in range(batch_size):
        if cu[x + 1] < cu[x]:
            raise ValueError(f"cu_seqlens must be non-decreasing, got {cu}")
        if cu[x + 1] - cu[x] > max_len:
            raise ValueError(f"sequence {x} has length {cu[x + 1] - cu[x]} > {what} = {max_len}")
    if cu[-1] > num_tokens:
        raise ValueError(f"cu_seqlens[-1] = {cu[-1]} is past the {num_tokens} tokens")
    return cu


def convert_thd_to_bshd(thd, cu_seqlens, batch_size, max_seqlen, compute_dtype=torch.float64):
    """Ragged [t, h, d] -> zero-padded [batch_size, max_seqlen, h, d] in compute_dtype."""
    cu = check_cu_seqlens(cu_seqlens, batch_size, thd.shape[0], max_seqlen)
    src = thd.to(compute_dtype)
    out = src.new_zeros((batch_size, max_seqlen) + tuple(thd.shape[1:]))  # (b, s, h, d)
    for x in range(batch_size):
        out[x, : cu[x + 1] - cu[x]] = src[cu[x] : cu[x + 1]]
    return out


def convert_bshd_to_thd(bshd, cu_seqlens, num_tokens, compute_dtype=torch.float64):
    """Padded [b, s, h, d] -> ragged [num_tokens, h, d] in compute_dtype; rows past cu[-1] are 0."""
    cu = check_cu_seqlens(cu_seqlens, bshd.shape[0], num_tokens, bshd.shape[1], "bshd.shape[1]")
    src = bshd.to(compute_dtype)
    out = src.new_zeros((num_tokens,) + tuple(bshd.shape[2:]))  # (t, h, d)
    for x in range(bshd.shape[0]):
        out[cu[x] : cu[x + 1]] = src[x, : cu[x + 1] - cu[x]]
    return out
