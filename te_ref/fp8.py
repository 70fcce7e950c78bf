"""FP8 emulation reference (SPEC §5): quantize/dequantize, scaling updates, and attention with
fake-quantization at the six points FP8 attention holds FP8 data. Plain PyTorch, readable."""

from __future__ import annotations

import torch

from te_ref.attention import build_mask
from te_ref.config import resolve
from te_ref.ops import convert_bshd_to_thd, convert_thd_to_bshd, masked_softmax

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
FORWARD_ROLES = ("QKV", "S", "O")
BACKWARD_ROLES = ("dO", "dP", "dQKV")


def quantize(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """cast_fp8(clamp(x * scale, -max, max)): values beyond the format's max saturate."""
    fmax = FP8_MAX[fp8_dtype]
    return (x.float() * scale).clamp(-fmax, fmax).to(fp8_dtype)


def dequantize(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """data / scale, computed as data * (1 / scale) in fp32, then cast to dtype."""
    return (data.float() * (1.0 / scale.float())).to(dtype)


def fake_quant(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """Quantize then dequantize, back in x's dtype."""
    return dequantize(quantize(x, scale, fp8_dtype), scale, x.dtype)


def current_scale(amax: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """Current scaling: max / amax, and 1 when amax == 0."""
    amax = amax.float()
    return torch.where(amax > 0, FP8_MAX[fp8_dtype] / amax, torch.ones_like(amax))


def update_delayed(
    amax_history: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    fp8_dtype: torch.dtype,
    margin: int = 0,
    algo: str = "max",
) -> tuple[torch.Tensor, torch.Tensor]:
    """After a step that used ``scale``: record ``amax`` (newest first, the oldest rolls out),
    then scale = max / amax_h / 2**margin with amax_h the history max ("max") or the newest
    entry ("most_recent"); an amax_h of 0 keeps the previous scale."""
    history = torch.cat([amax.float().reshape(1), amax_history[:-1]])
    amax_h = history.max() if algo == "max" else history[0]
    new_scale = torch.where(amax_h > 0, FP8_MAX[fp8_dtype] / amax_h / 2.0**margin, scale)
    return history, new_scale


def _repeat(t, h):
    return t.repeat_interleave(h // t.shape[1], dim=1)  # (b, hg, s, d) -> (b, h, s, d)


def _group_sum(t, hg):
    b, h, s, d = t.shape
    return t.reshape(b, hg, h // hg, s, d).sum(dim=2)  # (b, h, s, d) -> (b, hg, s, d)


def fp8_dot_product_attention(
    q, k, v, grad_out, *, qkv_layout, softmax_scale, scales, formats,
    compute_dtype=torch.float64, **kwargs,
):  # fmt: skip
    """Forward and backward of FP8-emulated attention with the given per-role scales.

    scales: role -> fp32 scalar tensor (the scale each role is quantized with);
    formats: role -> torch.float8_e4m3fn | torch.float8_e5m2.
    Fake quantization at: Q, K, V (one scale), S = softmax output, O; dO, dP (the gradient of
    the pre-softmax scores), dQ, dK, dV (one scale). Everything between the quantization points
    runs in compute_dtype. Returns (out, (dq, dk, dv), amaxes by role) in the input layouts.
    """
    call = resolve(q, k, v, qkv_layout=qkv_layout, softmax_scale=softmax_scale, **kwargs)
    cd, dev = compute_dtype, q.device
    b, sq, skv, h = call.b, call.sq, call.skv, call.h
    cu_q, cu_kv = call.cu_seqlens_q, call.cu_seqlens_kv
    q_format, kv_format = call.layout.q_format, call.layout.kv_format

    def heads_first(t, fmt, cu, s):  # any format -> (b, h, s, d)
        if fmt == "sbhd":
            return t.permute(1, 2, 0, 3)
        if fmt == "thd":
            return convert_thd_to_bshd(t, cu, b, s, compute_dtype=t.dtype).permute(0, 2, 1, 3)
        return t.permute(0, 2, 1, 3)

    def back_to_layout(t, fmt, cu, like):  # (b, h, s, d) -> the layout of ``like``
        if fmt == "sbhd":
            return t.permute(2, 0, 1, 3)
        if fmt == "thd":
            return convert_bshd_to_thd(t.permute(0, 2, 1, 3), cu, like.shape[0], compute_dtype=cd)
        return t.permute(0, 2, 1, 3)

    qh = heads_first(q.to(cd), q_format, cu_q, sq)  # (b, h, sq, d)
    kh = heads_first(k.to(cd), kv_format, cu_kv, skv)  # (b, hg, skv, d)
    vh = heads_first(v.to(cd), kv_format, cu_kv, skv)  # (b, hg, skv, dv)
    masked = build_mask(call, dev)  # (b, h|1, sq, skv)
    amax = {}

    def fq(role, *tensors):  # fake-quantize tensors that share one scale
        amax[role] = max(t.abs().max().float() for t in tensors)
        return [fake_quant(t, scales[role], formats[role]) for t in tensors]

    # ---- forward
    q8, k8, v8 = fq("QKV", qh, kh, vh)
    kr, vr = _repeat(k8, h), _repeat(v8, h)  # (b, h, skv, d)
    s = torch.matmul(q8, kr.transpose(-2, -1)) * call.scale  # (b, h, sq, skv)
    p = masked_softmax(s, masked)  # (b, h, sq, skv)
    (p8,) = fq("S", p)
    o = torch.matmul(p8, vr)  # (b, h, sq, dv)
    (o8,) = fq("O", o)
    out = back_to_layout(o8, q_format, cu_q, q).reshape(
        *(q.shape[:-2] if q_format != "thd" else q.shape[:1]), h * call.dv
    )

    # ---- backward, written out (dO -> dV, dP -> dQ, dK)
    do = heads_first(grad_out.to(cd).reshape(*grad_out.shape[:-1], h, call.dv),
                     q_format, cu_q, sq)  # fmt: skip
    (do8,) = fq("dO", do)
    dv = _group_sum(torch.matmul(p8.transpose(-2, -1), do8), call.hg)  # (b, hg, skv, dv)
    dp_soft = torch.matmul(do8, vr.transpose(-2, -1))  # (b, h, sq, skv)
    ds = call.scale * p * (dp_soft - (dp_soft * p).sum(-1, keepdim=True))  # softmax backward
    (ds8,) = fq("dP", ds)
    dq = torch.matmul(ds8, kr)  # (b, h, sq, d)
    dk = _group_sum(torch.matmul(ds8.transpose(-2, -1), q8), call.hg)  # (b, hg, skv, d)
    dq8, dk8, dv8 = fq("dQKV", dq, dk, dv)
    grads = (
        back_to_layout(dq8, q_format, cu_q, q),
        back_to_layout(dk8, kv_format, cu_kv, k),
        back_to_layout(dv8, kv_format, cu_kv, v),
    )
    return out, grads, amax
