"""Argument rules of dot-product attention: validation and normalisation, no tensor math.

te_ref and te_fast both call `resolve`, so they accept, reject and normalise arguments
identically; the tensor math that follows is written independently in each. Only shapes, dtypes,
plain ints and None-ness are read here (never tensor values), so this is safe under torch.compile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from te_ref.layouts import ATTN_MASK_TYPES, BIAS_TYPES, SOFTMAX_TYPES, Layout, parse_layout

_CAUSAL = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")
_TOP_LEFT = ("causal", "padding_causal")


@dataclass(frozen=True)
class AttentionConfig:
    """Everything static about one attention call."""

    layout: Layout
    attn_mask_type: str
    b: int
    sq: int  # padded query length (max_seqlen_q for thd)
    skv: int
    h: int
    hg: int
    dqk: int
    dv: int
    num_tokens_q: int | None  # t_q = q.shape[0] for thd q, else None
    q_lengths: str | None  # where per-batch query lengths come from: "cu_seqlens" | "mask" | None
    kv_lengths: str | None
    causal: bool
    window: tuple[int, int]  # (left, right), -1 = unbounded; causal types have right == 0
    bottom_right: bool  # alignment of the causal band, the window and alibi
    bias_type: str
    softmax_type: str


def _err(msg: str) -> ValueError:
    return ValueError(f"dot_product_attention: {msg}")


def _check_cu_seqlens(name: str, cu, b: int | None) -> int:
    if not isinstance(cu, torch.Tensor):
        raise _err(f"{name} must be an int32 tensor of shape [b + 1], got {type(cu).__name__}")
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 1:
        raise _err(
            f"{name} must be an int32 tensor of shape [b + 1], got {cu.dtype} {tuple(cu.shape)}"
        )
    if b is not None and cu.shape[0] != b + 1:
        raise _err(f"{name} must have shape [b + 1] = [{b + 1}], got {tuple(cu.shape)}")
    return cu.shape[0] - 1


def _check_max_seqlen(name: str, value, fmt_name: str) -> int:
    if value is None:
        raise _err(f"{name} is required for the thd format of {fmt_name} (a plain int)")
    if isinstance(value, torch.Tensor) or isinstance(value, bool) or value < 0:
        raise _err(f"{name} must be a non-negative plain int, got {value!r}")
    return value


def _seq_and_batch(fmt: str, t: torch.Tensor, what: str) -> tuple[int | None, int | None]:
    """(s, b) of a tensor in sbhd/bshd; (None, None) for thd (from cu_seqlens instead)."""
    want = 3 if fmt == "thd" else 4
    if t.dim() != want:
        raise _err(f"{what} in {fmt} must be {want}-D, got shape {tuple(t.shape)}")
    if fmt == "sbhd":
        return t.shape[0], t.shape[1]
    if fmt == "bshd":
        return t.shape[1], t.shape[0]
    return None, None


def _resolve_window(mask_type: str, window_size) -> tuple[int, int]:
    causal = mask_type in _CAUSAL
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise _err(f"window_size must be a pair of ints, got {window_size!r}") from None
    if left < -1 or right < -1:
        raise _err(f"window_size entries must be >= 0 or -1 (unbounded), got {window_size!r}")
    if causal:
        if right > 0:
            raise _err(
                f"window_size={window_size!r} conflicts with attn_mask_type={mask_type!r}: "
                "causal types allow no right context (use (left, 0) or (left, -1))"
            )
        right = 0
    return left, right


def resolve(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    qkv_layout: str,
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
    has_offset_parameter: bool = False,
) -> AttentionConfig:
    """Validate one call's arguments (ValueError naming the problem) and normalise them."""
    layout = parse_layout(qkv_layout)
    if attn_mask_type not in ATTN_MASK_TYPES:
        raise _err(f"unknown attn_mask_type {attn_mask_type!r}; expected one of {ATTN_MASK_TYPES}")
    if core_attention_bias_type not in BIAS_TYPES:
        raise _err(
            f"unknown core_attention_bias_type {core_attention_bias_type!r}; "
            f"expected one of {BIAS_TYPES}"
        )
    if softmax_type not in SOFTMAX_TYPES:
        raise _err(f"unknown softmax_type {softmax_type!r}; expected one of {SOFTMAX_TYPES}")
    if attention_type not in ("self", "cross"):
        raise _err(f"attention_type must be 'self' or 'cross', got {attention_type!r}")

    # ---- shapes
    sq, bq = _seq_and_batch(layout.q_format, q, "query_layer")
    skv, bk = _seq_and_batch(layout.kv_format, k, "key_layer")
    skv_v, bv = _seq_and_batch(layout.kv_format, v, "value_layer")
    h, dqk = q.shape[-2], q.shape[-1]
    hg, dv = k.shape[-2], v.shape[-1]
    if k.shape[-1] != dqk:
        raise _err(f"query and key head dims differ: {dqk} vs {k.shape[-1]}")
    if v.shape[-2] != hg or skv_v != skv or bv != bk or v.shape[:-2] != k.shape[:-2]:
        raise _err(
            f"key_layer {tuple(k.shape)} and value_layer {tuple(v.shape)} must agree "
            "in everything but the head dim"
        )
    if hg == 0 or h % hg != 0:
        raise _err(f"query heads ({h}) must be a multiple of key/value heads ({hg}) (GQA/MQA)")
    if not (q.dtype == k.dtype == v.dtype):
        raise _err(f"query/key/value dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")

    # ---- sequence lengths: thd formats always respect sequence boundaries
    padding = attn_mask_type.startswith("padding")
    q_lengths = kv_lengths = None
    if layout.q_format == "thd":
        if cu_seqlens_q is None:
            raise _err(f"qkv_layout {qkv_layout!r} needs cu_seqlens_q (int32 [b + 1])")
        bq = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, None)
        sq = _check_max_seqlen("max_seqlen_q", max_seqlen_q, "query_layer")
        q_lengths = "cu_seqlens"
    if layout.kv_format == "thd":
        if cu_seqlens_kv is None:
            raise _err(f"qkv_layout {qkv_layout!r} needs cu_seqlens_kv (int32 [b + 1])")
        bk = _check_cu_seqlens("cu_seqlens_kv", cu_seqlens_kv, None)
        skv = _check_max_seqlen("max_seqlen_kv", max_seqlen_kv, "key_layer/value_layer")
        kv_lengths = "cu_seqlens"
    elif layout.q_format == "thd":  # thd q with a padded kv cache: its filled lengths
        if cu_seqlens_kv is None:
            raise _err(
                f"qkv_layout {qkv_layout!r} needs cu_seqlens_kv: the filled length of each "
                "sequence of the kv cache"
            )
        _check_cu_seqlens("cu_seqlens_kv", cu_seqlens_kv, bk)
        kv_lengths = "cu_seqlens"
    if bq != bk:
        raise _err(f"query batch ({bq}) and key/value batch ({bk}) differ")
    b = bq

    if padding and (q_lengths is None or kv_lengths is None):
        if attention_mask is not None:
            _check_padding_mask(attention_mask, b, sq, skv, attention_type)
            q_lengths = q_lengths or "mask"
            kv_lengths = kv_lengths or "mask"
        elif cu_seqlens_q is not None:
            _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, b)
            if cu_seqlens_kv is None and sq != skv:
                raise _err("cross attention with padding needs cu_seqlens_kv as well")
            if cu_seqlens_kv is not None:
                _check_cu_seqlens("cu_seqlens_kv", cu_seqlens_kv, b)
            q_lengths = q_lengths or "cu_seqlens"
            kv_lengths = kv_lengths or "cu_seqlens"
        else:
            raise _err(
                f"attn_mask_type={attn_mask_type!r} needs the sequence lengths: attention_mask "
                "([b, 1, 1, s] bool, True = padding; a (q, kv) pair for cross attention) or "
                "cu_seqlens_q/cu_seqlens_kv"
            )
    elif attn_mask_type == "arbitrary":
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dtype != torch.bool:
            raise _err(
                "attn_mask_type='arbitrary' needs attention_mask: a bool tensor, True = masked"
            )
        try:
            torch.broadcast_shapes(tuple(attention_mask.shape), (b, h, sq, skv))
        except RuntimeError:
            raise _err(
                f"attention_mask of shape {tuple(attention_mask.shape)} does not broadcast to "
                f"[b, h, sq, skv] = {[b, h, sq, skv]}"
            ) from None
        if attention_mask.dim() != 4:
            raise _err(f"attention_mask must be 4-D, got {tuple(attention_mask.shape)}")
    elif attention_mask is not None and layout.q_format != "thd":
        raise _err(
            f"attention_mask is only used with padding* and 'arbitrary' mask types, not "
            f"{attn_mask_type!r}; pass attention_mask=None"
        )
    if layout.q_format == "thd" and attention_mask is not None and attn_mask_type != "arbitrary":
        raise _err("thd layouts take sequence lengths from cu_seqlens, not attention_mask")

    # ---- bias
    _check_bias(core_attention_bias_type, core_attention_bias, alibi_slopes, b, h, sq, skv)

    # ---- softmax type
    if softmax_type == "learnable" and softmax_offset is None and not has_offset_parameter:
        raise _err(
            "softmax_type='learnable' needs softmax_offset ([h] or [1, h, 1, 1]); pass it or "
            "construct the module with num_attention_heads"
        )
    if softmax_offset is not None:
        if softmax_type == "vanilla":
            raise _err("softmax_offset given with softmax_type='vanilla' (it would be ignored)")
        if tuple(softmax_offset.shape) not in ((h,), (1, h, 1, 1)):
            raise _err(
                f"softmax_offset must have shape [{h}] or [1, {h}, 1, 1], "
                f"got {tuple(softmax_offset.shape)}"
            )

    window = _resolve_window(attn_mask_type, window_size)
    bottom_right = (
        bool(bottom_right_diagonal)
        if bottom_right_diagonal is not None
        else attn_mask_type not in _TOP_LEFT
    )
    return AttentionConfig(
        layout=layout,
        attn_mask_type=attn_mask_type,
        b=b,
        sq=sq,
        skv=skv,
        h=h,
        hg=hg,
        dqk=dqk,
        dv=dv,
        num_tokens_q=q.shape[0] if layout.q_format == "thd" else None,
        q_lengths=q_lengths,
        kv_lengths=kv_lengths,
        causal=attn_mask_type in _CAUSAL,
        window=window,
        bottom_right=bottom_right,
        bias_type=core_attention_bias_type,
        softmax_type=softmax_type,
    )


def _check_padding_mask(mask, b, sq, skv, attention_type):
    if isinstance(mask, (tuple, list)):
        if len(mask) != 2:
            raise _err("attention_mask for cross attention is a pair (q_mask, kv_mask)")
        pairs = (("q", mask[0], sq), ("kv", mask[1], skv))
    else:
        if sq != skv:
            raise _err(
                f"sq ({sq}) != skv ({skv}): padding needs attention_mask as a pair "
                "([b, 1, 1, sq], [b, 1, 1, skv])"
            )
        pairs = (("q", mask, sq),)
    for name, m, s in pairs:
        if (
            not isinstance(m, torch.Tensor)
            or m.dtype != torch.bool
            or tuple(m.shape) != (b, 1, 1, s)
        ):
            shape = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
            raise _err(
                f"padding attention_mask ({name}) must be bool [{b}, 1, 1, {s}], got {shape}"
            )


def _check_bias(bias_type, bias, alibi_slopes, b, h, sq, skv):
    if bias_type in ("pre_scale_bias", "post_scale_bias"):
        if bias is None:
            raise _err(f"core_attention_bias_type={bias_type!r} needs core_attention_bias")
        shape = tuple(bias.shape)
        ok = (
            len(shape) == 4
            and shape[0] in (1, b)
            and shape[1] in (1, h)
            and shape[2] in (1, sq)
            and shape[3] == skv
        )
        if not ok:
            raise _err(
                f"core_attention_bias must have shape [b|1, h|1, sq|1, skv] = "
                f"[{b}|1, {h}|1, {sq}|1, {skv}], got {shape}"
            )
    elif bias is not None:
        raise _err(f"core_attention_bias given with core_attention_bias_type={bias_type!r}")
    if bias_type == "alibi" and alibi_slopes is not None:
        if tuple(alibi_slopes.shape) not in ((h,), (b, h)):
            raise _err(
                f"alibi_slopes must have shape [{h}] or [{b}, {h}], got {tuple(alibi_slopes.shape)}"
            )
    elif alibi_slopes is not None and bias_type != "alibi":
        raise _err("alibi_slopes given without core_attention_bias_type='alibi'")
