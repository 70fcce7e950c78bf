"""The implementation: one plain torch composite, (b, h, s, d) in, (b, h, sq, dv) out."""

from __future__ import annotations

import torch


def attention(q, k, v, *, scale=None, causal=False, bottom_right=False, mask=None):
    """softmax(q k^T * scale, masked) v for q (b, h, sq, d), k (b, hg, skv, d), v (b, hg, skv, dv).

    ``causal`` keeps key j <= i (top-left) or j <= i + skv - sq (``bottom_right``); ``mask`` is a
    bool tensor broadcast to (b, h, sq, skv), True = masked out. A fully masked row gives 0.
    """
    h, hg = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // hg, dim=1)  # query head i uses kv head i // (h / hg)
    v = v.repeat_interleave(h // hg, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * scale  # (b, h, sq, skv)
    sq, skv = scores.shape[-2:]
    masked = torch.zeros(sq, skv, dtype=torch.bool, device=q.device)
    if causal:
        masked = ~torch.ones_like(masked).tril(diagonal=skv - sq if bottom_right else 0)
    if mask is not None:
        masked = masked | mask
    scores = scores.masked_fill(masked, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: 0, not NaN
    return torch.matmul(probs.to(v.dtype), v)  # (b, h, sq, dv)
