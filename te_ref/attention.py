"""Reference dot-product attention (SPEC §2): plain PyTorch, float64 by default, differentiable."""

from __future__ import annotations

import math

import torch

from te_ref.config import AttentionConfig, resolve
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


def _lengths(source, cu_seqlens, mask):
    """Per-batch lengths (b,) from cu_seqlens or a padding mask [b, 1, 1, s] (True = padding)."""
    if source == "cu_seqlens":
        return (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return (~mask).sum(dim=(1, 2, 3))


def build_mask(cfg: AttentionConfig, lq, lkv, attention_mask, device) -> torch.Tensor:
    """Bool mask (b, h|1, sq, skv), True = masked out, built one batch element at a time.

    Inside element x only the first lq[x] query rows and lkv[x] key columns are real; among them
    the band of the causal type / window is kept: tril keeps j <= i + k, triu keeps j >= i + k.
    """
    left, right = cfg.window
    keep = torch.zeros(cfg.b, 1, cfg.sq, cfg.skv, dtype=torch.bool, device=device)
    for x in range(cfg.b):
        q_len = int(lq[x]) if lq is not None else cfg.sq
        kv_len = int(lkv[x]) if lkv is not None else cfg.skv
        diagonal = kv_len - q_len if cfg.bottom_right else 0
        band = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)  # (lq, lkv)
        if right >= 0:
            band = band.tril(diagonal=diagonal + right)
        if left >= 0:
            band = band.triu(diagonal=diagonal - left)
        keep[x, 0, :q_len, :kv_len] = band
    masked = ~keep  # (b, 1, sq, skv)
    if cfg.attn_mask_type == "arbitrary":
        masked = masked | attention_mask  # (b, h|1, sq, skv)
    return masked


def alibi_bias(cfg: AttentionConfig, slopes, lq, lkv, device) -> torch.Tensor:
    """-slope_h * |i - j + off| of shape (b, h, sq, skv) in float64, off per element's alignment."""
    if slopes is None:
        slopes = torch.tensor(default_alibi_slopes(cfg.h), dtype=torch.float64, device=device)
    slopes = slopes.to(torch.float64).reshape(-1, cfg.h).expand(cfg.b, cfg.h)  # (b, h)
    i = torch.arange(cfg.sq, device=device, dtype=torch.float64).view(cfg.sq, 1)
    j = torch.arange(cfg.skv, device=device, dtype=torch.float64).view(1, cfg.skv)
    bias = torch.empty(cfg.b, cfg.h, cfg.sq, cfg.skv, dtype=torch.float64, device=device)
    for x in range(cfg.b):
        q_len = int(lq[x]) if lq is not None else cfg.sq
        kv_len = int(lkv[x]) if lkv is not None else cfg.skv
        offset = kv_len - q_len if cfg.bottom_right else 0
        distance = (i - j + offset).abs()  # (sq, skv)
        bias[x] = -slopes[x].view(cfg.h, 1, 1) * distance  # (h, sq, skv)
    return bias


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
    cfg = resolve(
        q, k, v,
        qkv_layout=qkv_layout, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, attn_mask_type=attn_mask_type,
        attention_mask=attention_mask, window_size=window_size,
        bottom_right_diagonal=bottom_right_diagonal,
        core_attention_bias_type=core_attention_bias_type, core_attention_bias=core_attention_bias,
        alibi_slopes=alibi_slopes, softmax_type=softmax_type, softmax_offset=softmax_offset,
        attention_type=attention_type,
    )  # fmt: skip
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dot_product_attention: dropout_p must be in [0, 1), got {dropout_p}")
    cd, dev = compute_dtype, q.device
    b, sq, skv, h = cfg.b, cfg.sq, cfg.skv, cfg.h
    scale = cfg.dqk**-0.5 if softmax_scale is None else softmax_scale
    cu_kv = cu_seqlens_kv if cu_seqlens_kv is not None else cu_seqlens_q

    qb = _to_bshd(q.to(cd), cfg.layout.q_format, cu_seqlens_q, b, sq)  # (b, sq, h, dqk)
    kb = _to_bshd(k.to(cd), cfg.layout.kv_format, cu_kv, b, skv)  # (b, skv, hg, dqk)
    vb = _to_bshd(v.to(cd), cfg.layout.kv_format, cu_kv, b, skv)  # (b, skv, hg, dv)
    rep = h // cfg.hg  # query head i uses kv head i // rep
    qh = qb.permute(0, 2, 1, 3)  # (b, h, sq, dqk)
    kh = kb.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)  # (b, h, skv, dqk)
    vh = vb.permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)  # (b, h, skv, dv)

    lq = lkv = None
    if cfg.q_lengths is not None:
        pair = isinstance(attention_mask, (tuple, list))
        mask_q = attention_mask[0] if pair else attention_mask
        mask_kv = attention_mask[1] if pair else attention_mask
        lq = _lengths(cfg.q_lengths, cu_seqlens_q, mask_q)  # (b,)
        lkv = _lengths(cfg.kv_lengths, cu_kv, mask_kv)  # (b,)

    scores = torch.matmul(qh, kh.transpose(-2, -1))  # (b, h, sq, skv)
    if cfg.bias_type == "pre_scale_bias":
        s = (scores + core_attention_bias.to(cd)) * scale
    elif cfg.bias_type == "post_scale_bias":
        s = scores * scale + core_attention_bias.to(cd)
    elif cfg.bias_type == "alibi":
        s = scores * scale + alibi_bias(cfg, alibi_slopes, lq, lkv, dev).to(cd)
    else:
        s = scores * scale
    masked = build_mask(cfg, lq, lkv, attention_mask, dev)  # (b, h|1, sq, skv)

    if cfg.softmax_type == "vanilla":
        p = masked_softmax(s, masked)  # (b, h, sq, skv)
    else:  # one extra logit joins the denominator: 0 (off-by-one) or softmax_offset[h]
        if cfg.softmax_type == "off-by-one":
            sink = torch.zeros(1, h, 1, 1, dtype=cd, device=dev)
        else:
            sink = softmax_offset.to(cd).reshape(1, h, 1, 1)
        s_ext = torch.cat([s, sink.expand(b, h, sq, 1)], dim=-1)  # (b, h, sq, skv + 1)
        m_ext = torch.cat(
            [masked.expand(b, h, sq, skv), torch.zeros(b, h, sq, 1, dtype=torch.bool, device=dev)],
            dim=-1,
        )
        p = masked_softmax(s_ext, m_ext)[..., :skv]  # (b, h, sq, skv)
    if dropout_p > 0.0:
        p = torch.nn.functional.dropout(p, dropout_p, training=True)

    o = torch.matmul(p, vh).permute(0, 2, 1, 3)  # (b, sq, h, dv)
    dv = cfg.dv
    if cfg.layout.q_format == "sbhd":
        out = o.transpose(0, 1).reshape(sq, b, h * dv)  # (sq, b, h*dv)
    elif cfg.layout.q_format == "bshd":
        out = o.reshape(b, sq, h * dv)  # (b, sq, h*dv)
    else:
        t = cfg.num_tokens_q
        out = convert_bshd_to_thd(o, cu_seqlens_q, t, compute_dtype=cd).reshape(
            t, h * dv
        )  # (t, h*dv)
    if not return_max_logit:
        return out
    # (h,): fp32 as TE returns it, but kept in float64 for the float64 golden answer
    logit_dtype = torch.float64 if cd == torch.float64 else torch.float32
    max_logit = s.to(logit_dtype).masked_fill(masked, float("-inf")).amax(dim=(0, 2, 3))
    return out, max_logit
