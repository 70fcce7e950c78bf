"""Reference dot-product attention (SPEC §2): plain PyTorch, float64 by default, differentiable."""

from __future__ import annotations

import math

import torch

from te_ref.config import AttentionCall, resolve
from te_ref.ops import convert_bshd_to_thd, convert_thd_to_bshd, masked_softmax


def default_alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi slopes: 2**(-8k/n) for k = 1..n (n = 2**floor(log2 h)), then odd 2**(-4k/n)."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (num_heads - n), 2)]
    return slopes


def _to_bshd(t, fmt, cu_seqlens, b, s):
    if fmt == "sbhd":
        return t.transpose(0, 1)  # (s, b, h, d) -> (b, s, h, d)
    if fmt == "thd":
        return convert_thd_to_bshd(t, cu_seqlens, b, s, compute_dtype=t.dtype)  # (b, s, h, d)
    return t  # (b, s, h, d)


def build_mask(call: AttentionCall, device) -> torch.Tensor:
    """Bool mask (b, h|1, sq, skv), True = masked out, built one batch element at a time.

    Padding masks exactly the positions marked (an attention_mask of any pattern, left padding
    too; from cu_seqlens, the positions past each length). The causal band / window is laid
    over the padded [sq, skv] grid, its diagonal offset by kv_len - q_len (the element's counts
    of real positions) when bottom-right: tril keeps j <= i + k, triu keeps j >= i + k.
    (TE 2.20.2: utils.py get_full_mask, 1977-2126.)
    """
    left, right = call.window
    keep = torch.zeros(call.b, 1, call.sq, call.skv, dtype=torch.bool, device=device)
    real_q, real_kv = _real_positions(call, device)  # (b, sq), (b, skv)
    for x in range(call.b):
        q_len, kv_len = _lengths_of(call, x)
        diagonal = kv_len - q_len if call.bottom_right else 0
        band = torch.ones(call.sq, call.skv, dtype=torch.bool, device=device)  # (sq, skv)
        if right >= 0:
            band = band.tril(diagonal=diagonal + right)
        if left >= 0:
            band = band.triu(diagonal=diagonal - left)
        keep[x, 0] = band & real_q[x].view(-1, 1) & real_kv[x].view(1, -1)
    masked = ~keep  # (b, 1, sq, skv)
    if call.attn_mask_type == "arbitrary":
        masked = masked | call.attention_mask  # (b, h|1, sq, skv)
    return masked


def _real_positions(call: AttentionCall, device):
    """(b, sq) and (b, skv) bool, True = a real (unpadded) position."""
    if isinstance(call.attention_mask, torch.Tensor) and call.attn_mask_type.startswith("padding"):
        m = call.attention_mask.to(device)
        return ~m[:, 0, 0, :], ~m[:, 0, 0, :]
    if isinstance(call.attention_mask, (tuple, list)):
        mq, mkv = (m.to(device) for m in call.attention_mask)
        return ~mq[:, 0, 0, :], ~mkv[:, 0, 0, :]
    i = torch.arange(call.sq, device=device).view(1, -1)
    j = torch.arange(call.skv, device=device).view(1, -1)
    lq = call.lengths_q.to(device).view(-1, 1) if call.lengths_q is not None else call.sq
    lkv = call.lengths_kv.to(device).view(-1, 1) if call.lengths_kv is not None else call.skv
    return (i < lq).expand(call.b, -1), (j < lkv).expand(call.b, -1)


def alibi_bias(call: AttentionCall, device) -> torch.Tensor:
    """-slope_h * |i - j + off| of shape (b, h, sq, skv) in float64, off per element's alignment."""
    h = call.h
    slopes = call.alibi_slopes
    if slopes is None:
        slopes = torch.tensor(default_alibi_slopes(h), dtype=torch.float64, device=device)
    slopes = slopes.to(torch.float64).reshape(-1, h).expand(call.b, h)  # (b, h)
    i = torch.arange(call.sq, device=device, dtype=torch.float64).view(call.sq, 1)
    j = torch.arange(call.skv, device=device, dtype=torch.float64).view(1, call.skv)
    bias = torch.empty(call.b, h, call.sq, call.skv, dtype=torch.float64, device=device)
    for x in range(call.b):
        q_len, kv_len = _lengths_of(call, x)
        offset = kv_len - q_len if call.bottom_right else 0
        distance = (i - j + offset).abs()  # (sq, skv)
        bias[x] = -slopes[x].view(h, 1, 1) * distance  # (h, sq, skv)
    return bias


def _lengths_of(call: AttentionCall, x: int) -> tuple[int, int]:
    """(q length, kv length) of batch element x: the real lengths, or the padded ones."""
    q_len = int(call.lengths_q[x]) if call.lengths_q is not None else call.sq
    kv_len = int(call.lengths_kv[x]) if call.lengths_kv is not None else call.skv
    return q_len, kv_len


def dot_product_attention(
    query_layer: torch.Tensor,
    key_layer: torch.Tensor,
    value_layer: torch.Tensor,
    *,
    qkv_layout: str,
    softmax_scale: float | None = None,
    cu_seqlens_q=None,
    cu_seqlens_kv=None,
    max_seqlen_q=None,
    max_seqlen_kv=None,
    attn_mask_type: str = "causal",
    attention_mask=None,
    window_size=None,
    bottom_right_diagonal=None,
    core_attention_bias_type: str = "no_bias",
    core_attention_bias=None,
    alibi_slopes=None,
    softmax_type: str = "vanilla",
    softmax_offset=None,
    attention_type: str = "self",
    dropout_p: float = 0.0,
    return_max_logit: bool = False,
    compute_dtype: torch.dtype = torch.float64,
):
    """Attention output in the layout's output shape (SPEC §1), in compute_dtype.

    compute_dtype=float64 gives the golden answer; the input dtype gives the same-precision naive
    composite (input-dtype matmuls and elementwise ops, torch.softmax with its fp32 accumulation)
    used by the error-ratio rule. With
    return_max_logit the result is (out, max_logit [h] fp32).
    """
    q, k, v = query_layer, key_layer, value_layer
    call = resolve(
        q, k, v,
        qkv_layout=qkv_layout, softmax_scale=softmax_scale, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
        attn_mask_type=attn_mask_type, attention_mask=attention_mask, window_size=window_size,
        bottom_right_diagonal=bottom_right_diagonal,
        core_attention_bias_type=core_attention_bias_type, core_attention_bias=core_attention_bias,
        alibi_slopes=alibi_slopes, softmax_type=softmax_type, softmax_offset=softmax_offset,
        attention_type=attention_type,
    )  # fmt: skip
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dot_product_attention: dropout_p must be in [0, 1), got {dropout_p}")
    return _attention(call, q, k, v, dropout_p, return_max_logit, compute_dtype)


def _attention(call: AttentionCall, q, k, v, dropout_p, return_max_logit, compute_dtype):
    """SPEC §2 on one resolved call, in compute_dtype."""
    cd, dev = compute_dtype, q.device
    b, sq, skv, h = call.b, call.sq, call.skv, call.h
    scale = call.scale
    cu_q, cu_kv = call.cu_seqlens_q, call.cu_seqlens_kv

    qb = _to_bshd(q.to(cd), call.layout.q_format, cu_q, b, sq)  # (b, sq, h, dqk)
    kb = _to_bshd(k.to(cd), call.layout.kv_format, cu_kv, b, skv)  # (b, skv, hg, dqk)
    vb = _to_bshd(v.to(cd), call.layout.kv_format, cu_kv, b, skv)  # (b, skv, hg, dv)
    rep = h // call.hg  # query head i uses kv head i // rep
    qh = qb.permute(0, 2, 1, 3)  # (b, h, sq, dqk)
    kh = kb.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)  # (b, h, skv, dqk)
    vh = vb.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)  # (b, h, skv, dv)

    scores = torch.matmul(qh, kh.transpose(-2, -1))  # (b, h, sq, skv)
    if call.bias_type == "pre_scale_bias":
        s = (scores + call.bias.to(cd)) * scale
    elif call.bias_type == "post_scale_bias":
        s = scores * scale + call.bias.to(cd)
    elif call.bias_type == "alibi":
        s = scores * scale + alibi_bias(call, dev).to(cd)
    else:
        s = scores * scale
    masked = build_mask(call, dev)  # (b, h|1, sq, skv)

    if call.softmax_type == "vanilla":
        p = masked_softmax(s, masked)  # (b, h, sq, skv)
    else:  # one extra logit joins the denominator: 0 (off-by-one) or softmax_offset[h]
        if call.softmax_type == "off-by-one":
            sink = torch.zeros(1, h, 1, 1, dtype=cd, device=dev)
        else:
            sink = call.softmax_offset.to(cd).reshape(1, h, 1, 1)
        s_ext = torch.cat([s, sink.expand(b, h, sq, 1)], dim=-1)  # (b, h, sq, skv + 1)
        m_ext = torch.cat(
            [masked.expand(b, h, sq, skv), torch.zeros(b, h, sq, 1, dtype=torch.bool, device=dev)],
            dim=-1,
        )
        p = masked_softmax(s_ext, m_ext)[..., :skv]  # (b, h, sq, skv)
    if dropout_p > 0.0:
        p = torch.nn.functional.dropout(p, dropout_p, training=True)

    o = torch.matmul(p, vh).permute(0, 2, 1, 3)  # (b, sq, h, dv)
    dv = call.dv
    if call.layout.q_format == "sbhd":
        out = o.transpose(0, 1).reshape(sq, b, h * dv)  # (sq, b, h*dv)
    elif call.layout.q_format == "bshd":
        out = o.reshape(b, sq, h * dv)  # (b, sq, h*dv)
    else:
        t = call.num_tokens_q
        out = convert_bshd_to_thd(o, cu_q, t, compute_dtype=cd).reshape(t, h * dv)  # (t, h*dv)
    if not return_max_logit:
        return out
    # (h,): fp32 as TE returns it, but kept in float64 for the float64 golden answer
    logit_dtype = torch.float64 if cd == torch.float64 else torch.float32
    max_logit = s.to(logit_dtype).masked_fill(masked, float("-inf")).amax(dim=(0, 2, 3))
    return out, max_logit
