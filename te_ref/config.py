"""Argument rules of the reference: validate one attention call and gather it into one
`AttentionCall` (the resolved configuration and the tensors the math needs).

te_fast has its own rules (te_fast/_arguments.py), written independently, so that a misreading of
the SPEC in either shows up against the other; only the error texts are kept the same on purpose.
No tensor math happens here beyond the per-batch lengths.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from te_ref.layouts import (
    ATTN_MASK_TYPES,
    BIAS_TYPES,
    CAUSAL_MASK_TYPES,
    SOFTMAX_TYPES,
    TOP_LEFT_MASK_TYPES,
    Layout,
    parse_layout,
)

# query_layer/key_layer/value_layer dtypes: te_fast's three, and float64 (the golden answer's
# inputs: the suites call the reference on float64 copies).
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class AttentionCall:
    """One validated attention call."""

    # ---- configuration
    layout: Layout
    attn_mask_type: str
    b: int
    sq: int  # padded query length (max_seqlen_q for thd)
    skv: int  # padded key/value length (max_seqlen_kv for thd)
    h: int
    hg: int
    dqk: int
    dv: int
    num_tokens_q: int | None  # t_q = q.shape[0] for thd q, else None
    causal: bool
    window: tuple[int, int]  # (left, right), -1 = unbounded; causal types have right == 0
    bottom_right: bool  # alignment of the causal band, the window and alibi
    bias_type: str
    softmax_type: str
    scale: float  # softmax_scale, dqk ** -0.5 when not given
    # ---- tensors
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_kv: torch.Tensor | None  # cu_seqlens_q when the call gave none
    lengths_q: torch.Tensor | None  # (b,) int64 for padded and thd calls, else None
    lengths_kv: torch.Tensor | None
    attention_mask: torch.Tensor | tuple | None
    bias: torch.Tensor | None
    alibi_slopes: torch.Tensor | None  # None: the default slopes
    softmax_offset: torch.Tensor | None


def _err(msg: str) -> ValueError:
    return ValueError(f"dot_product_attention: {msg}")


def resolve(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
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
) -> AttentionCall:
    """Validate one call's arguments (ValueError naming the problem) and resolve its defaults."""
    layout = parse_layout(qkv_layout)
    _check_choices(attn_mask_type, core_attention_bias_type, softmax_type, attention_type)
    h, hg, dqk, dv = _check_qkv(layout, q, k, v)
    b, sq, skv = _batch_and_lengths(
        layout, q, k, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv
    )
    lengths_from = _lengths_source(
        layout, attn_mask_type, attention_mask, cu_seqlens_q, cu_seqlens_kv, b, h, sq, skv
    )
    _check_bias(core_attention_bias_type, core_attention_bias, alibi_slopes, b, h, sq, skv,
                q.dtype)  # fmt: skip
    _check_sequences_fit(layout, q, k, cu_seqlens_q, cu_seqlens_kv, sq, skv)
    _check_softmax_offset(softmax_type, softmax_offset, h)
    window = _window(attn_mask_type, window_size)
    if cu_seqlens_kv is None:  # kv lengths default to the query's
        cu_seqlens_kv = cu_seqlens_q
    lengths_q, lengths_kv = _lengths(lengths_from, cu_seqlens_q, cu_seqlens_kv, attention_mask)
    return AttentionCall(
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
        causal=attn_mask_type in CAUSAL_MASK_TYPES,
        window=window,
        bottom_right=_bottom_right(attn_mask_type, bottom_right_diagonal),
        bias_type=core_attention_bias_type,
        softmax_type=softmax_type,
        scale=dqk**-0.5 if softmax_scale is None else softmax_scale,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_kv=cu_seqlens_kv,
        lengths_q=lengths_q,
        lengths_kv=lengths_kv,
        attention_mask=attention_mask,
        bias=core_attention_bias,
        alibi_slopes=alibi_slopes,
        softmax_offset=softmax_offset,
    )


# ----------------------------------------------------------------------------- the steps


def _check_choices(attn_mask_type, bias_type, softmax_type, attention_type):
    """Each string argument names one of the SPEC's choices."""
    if attn_mask_type not in ATTN_MASK_TYPES:
        raise _err(f"unknown attn_mask_type {attn_mask_type!r}; expected one of {ATTN_MASK_TYPES}")
    if bias_type not in BIAS_TYPES:
        raise _err(f"unknown core_attention_bias_type {bias_type!r}; expected one of {BIAS_TYPES}")
    if softmax_type not in SOFTMAX_TYPES:
        raise _err(f"unknown softmax_type {softmax_type!r}; expected one of {SOFTMAX_TYPES}")
    if attention_type not in ("self", "cross"):
        raise _err(f"attention_type must be 'self' or 'cross', got {attention_type!r}")


def _check_qkv(layout: Layout, q, k, v) -> tuple[int, int, int, int]:
    """(h, hg, dqk, dv), after checking ranks, head dims, GQA and dtypes."""
    for fmt, t, what in (
        (layout.q_format, q, "query_layer"),
        (layout.kv_format, k, "key_layer"),
        (layout.kv_format, v, "value_layer"),
    ):
        rank = 3 if fmt == "thd" else 4
        if t.dim() != rank:
            raise _err(f"{what} in {fmt} must be {rank}-D, got shape {tuple(t.shape)}")
    h, dqk = q.shape[-2], q.shape[-1]
    hg, dv = k.shape[-2], v.shape[-1]
    if k.shape[-1] != dqk:
        raise _err(f"query and key head dims differ: {dqk} vs {k.shape[-1]}")
    if v.shape[:-1] != k.shape[:-1]:  # the same tokens and kv heads; only dv may differ (MLA)
        raise _err(
            f"key_layer {tuple(k.shape)} and value_layer {tuple(v.shape)} must agree "
            "in everything but the head dim"
        )
    if hg == 0 or h % hg != 0:
        raise _err(f"query heads ({h}) must be a multiple of key/value heads ({hg}) (GQA/MQA)")
    if not (q.dtype == k.dtype == v.dtype):
        raise _err(f"query/key/value dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in DTYPES:
        raise _err(
            "query_layer must have dtype torch.float16, torch.bfloat16, torch.float32 or "
            f"torch.float64 (key_layer and value_layer share it), got {q.dtype} {tuple(q.shape)}"
        )
    return h, hg, dqk, dv


def _batch_and_lengths(layout, q, k, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv):
    """(b, sq, skv): from the tensors for sbhd/bshd; a thd side takes b from its cu_seqlens and
    its padded length from max_seqlen (both required)."""
    name = layout.name
    if layout.q_format == "thd":
        if cu_seqlens_q is None:
            raise _err(f"qkv_layout {name!r} needs cu_seqlens_q (int32 [b + 1])")
        bq = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, None)
        sq = _check_max_seqlen("max_seqlen_q", max_seqlen_q, "query_layer")
    else:
        bq, sq = _padded_batch_and_length(layout.q_format, q)
    if layout.kv_format == "thd":
        if cu_seqlens_kv is None:
            raise _err(f"qkv_layout {name!r} needs cu_seqlens_kv (int32 [b + 1])")
        bk = _check_cu_seqlens("cu_seqlens_kv", cu_seqlens_kv, None)
        skv = _check_max_seqlen("max_seqlen_kv", max_seqlen_kv, "key_layer/value_layer")
    else:
        bk, skv = _padded_batch_and_length(layout.kv_format, k)
        if layout.q_format == "thd":  # thd q with a padded kv cache: its filled lengths
            if cu_seqlens_kv is None:
                raise _err(
                    f"qkv_layout {name!r} needs cu_seqlens_kv: the filled length of each "
                    "sequence of the kv cache"
                )
            _check_cu_seqlens("cu_seqlens_kv", cu_seqlens_kv, bk)
    if bq != bk:
        raise _err(f"query batch ({bq}) and key/value batch ({bk}) differ")
    return bq, sq, skv


def _padded_batch_and_length(fmt: str, t) -> tuple[int, int]:
    if fmt == "sbhd":
        return t.shape[1], t.shape[0]  # (s, b, h, d)
    return t.shape[0], t.shape[1]  # (b, s, h, d)


def _check_cu_seqlens(name: str, cu, b: int | None) -> int:
    """b, from a valid cu_seqlens (int32 [b + 1]); b, when given, must match."""
    if not isinstance(cu, torch.Tensor):
        raise _err(f"{name} must be an int32 tensor of shape [b + 1], got {type(cu).__name__}")
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 1:
        raise _err(
            f"{name} must be an int32 tensor of shape [b + 1], got {cu.dtype} {tuple(cu.shape)}"
        )
    if b is not None and cu.shape[0] != b + 1:
        raise _err(f"{name} must have shape [b + 1] = [{b + 1}], got {tuple(cu.shape)}")
    return cu.shape[0] - 1


def _check_sequences_fit(layout, q, k, cu_seqlens_q, cu_seqlens_kv, sq, skv):
    """Each thd side's sequences fit its max_seqlen: the first sequence that breaks the
    conversion's rule (SPEC §3), if it breaks it by its length, is an error naming
    max_seqlen_q/max_seqlen_kv; the conversion reports the rule's other faults itself."""
    sides = []
    if layout.q_format == "thd":
        sides.append(("q", cu_seqlens_q, sq, q.shape[0]))
    if layout.kv_format == "thd":
        sides.append(("kv", cu_seqlens_kv, skv, k.shape[0]))
    for side, cu, limit, tokens in sides:
        cu = cu.tolist()
        if cu[0] != 0:
            continue
        for x in range(len(cu) - 1):
            start, end = cu[x], cu[x + 1]
            if end < start:
                break
            if end - start > limit:
                raise _err(
                    f"max_seqlen_{side} must be at least the longest sequence of "
                    f"cu_seqlens_{side}, got max_seqlen_{side} = {limit} < {end - start}, the "
                    f"length of sequence {x}"
                )
            if end > tokens:
                break


def _check_max_seqlen(name: str, value, what: str) -> int:
    if value is None:
        raise _err(f"{name} is required for the thd format of {what} (a plain int)")
    if isinstance(value, torch.Tensor) or isinstance(value, bool) or value < 0:
        raise _err(f"{name} must be a non-negative plain int, got {value!r}")
    return value


def _lengths_source(layout, mask_type, attention_mask, cu_seqlens_q, cu_seqlens_kv, b, h, sq,
                    skv) -> str | None:  # fmt: skip
    """Where the per-batch lengths come from: "cu_seqlens", "mask", or None (all positions are
    real). thd always has them (it respects sequence boundaries whatever the mask type)."""
    thd = layout.q_format == "thd"
    if thd and not mask_type.startswith("padding"):
        # TE: "Attention mask type must be padding or padding_causal for qkv_format=thd!"
        # (dot_product_attention.py:2449-2452)
        raise _err(
            f"attn_mask_type={mask_type!r} is not valid for qkv_layout {layout.name!r}: a thd q "
            "takes padding, padding_causal or padding_causal_bottom_right"
        )
    if mask_type == "arbitrary":
        _check_arbitrary_mask(attention_mask, b, h, sq, skv)
        return "cu_seqlens" if thd else None
    if thd:
        if attention_mask is not None:
            raise _err("thd layouts take sequence lengths from cu_seqlens, not attention_mask")
        return "cu_seqlens"
    if mask_type.startswith("padding"):
        if attention_mask is not None:
            _check_padding_mask(attention_mask, b, sq, skv)
            return "mask"
        if cu_seqlens_q is not None:
            _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, b)
            if cu_seqlens_kv is None and sq != skv:
                raise _err("cross attention with padding needs cu_seqlens_kv as well")
            if cu_seqlens_kv is not None:
                _check_cu_seqlens("cu_seqlens_kv", cu_seqlens_kv, b)
            return "cu_seqlens"
        raise _err(
            f"attn_mask_type={mask_type!r} needs the sequence lengths: attention_mask "
            "([b, 1, 1, s] bool, True = padding; a (q, kv) pair for cross attention) or "
            "cu_seqlens_q/cu_seqlens_kv"
        )
    if attention_mask is not None:
        raise _err(
            f"attention_mask is only used with padding* and 'arbitrary' mask types, not "
            f"{mask_type!r}; pass attention_mask=None"
        )
    return None


def _check_arbitrary_mask(mask, b, h, sq, skv):
    """A torch.bool tensor (TE's docstring: "Boolean tensor(s)"), broadcastable, 4-D."""
    if mask is None:
        raise _err("attn_mask_type='arbitrary' needs attention_mask: a bool tensor, True = masked")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise _err(
            "attention_mask for attn_mask_type='arbitrary' must be torch.bool (True = masked), "
            f"got {_received(mask)}"
        )
    try:
        torch.broadcast_shapes(tuple(mask.shape), (b, h, sq, skv))
    except RuntimeError:
        raise _err(
            f"attention_mask of shape {tuple(mask.shape)} does not broadcast to "
            f"[b, h, sq, skv] = {[b, h, sq, skv]}"
        ) from None
    if mask.dim() != 4:
        raise _err(f"attention_mask must be 4-D, got {tuple(mask.shape)}")


def _check_padding_mask(mask, b, sq, skv):
    """[b, 1, 1, s] bool (True = padding); a (q, kv) pair when sq != skv."""
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
            raise _err(
                f"padding attention_mask ({name}) must be torch.bool [{b}, 1, 1, {s}], "
                f"got {_received(m)}"
            )


def _received(t) -> str:
    """What an error message shows of a tensor argument: its dtype and shape."""
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_bias(bias_type, bias, alibi_slopes, b, h, sq, skv, dtype):
    """The bias: q's dtype (TE 2.20.2's fused attention, cpp_extensions/fused_attn.py:340-344;
    docs/SEMANTICS.md), shape [b|1, h|1, sq|1, skv]; alibi_slopes [h] or [b, h]."""
    if bias_type in ("pre_scale_bias", "post_scale_bias"):
        if bias is None:
            raise _err(f"core_attention_bias_type={bias_type!r} needs core_attention_bias")
        shape = tuple(bias.shape)
        if bias.dtype != dtype:
            raise _err(
                f"core_attention_bias must have the dtype of query_layer, {dtype}, "
                f"got {bias.dtype} {shape}"
            )
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
    if alibi_slopes is None:
        return
    if bias_type != "alibi":
        raise _err("alibi_slopes given without core_attention_bias_type='alibi'")
    if tuple(alibi_slopes.shape) not in ((h,), (b, h)):
        raise _err(
            f"alibi_slopes must have shape [{h}] or [{b}, {h}], got {tuple(alibi_slopes.shape)}"
        )


def _check_softmax_offset(softmax_type, offset, h):
    """learnable needs an offset [h] or [1, h, 1, 1]; vanilla takes none."""
    if softmax_type == "learnable" and offset is None:
        raise _err(
            "softmax_type='learnable' needs softmax_offset ([h] or [1, h, 1, 1]); pass it or "
            "construct the module with num_attention_heads"
        )
    if offset is None:
        return
    if softmax_type == "vanilla":
        raise _err("softmax_offset given with softmax_type='vanilla' (it would be ignored)")
    if tuple(offset.shape) not in ((h,), (1, h, 1, 1)):
        raise _err(
            f"softmax_offset must have shape [{h}] or [1, {h}, 1, 1], got {tuple(offset.shape)}"
        )


def _window(mask_type: str, window_size) -> tuple[int, int]:
    """(left, right), -1 = unbounded, as TE 2.20.2's check_set_window_size reads it
    (attention/dot_product_attention/utils.py:2992-3034), warnings included:

    causal types: None -> (-1, 0); (-1, 0) and (>= 0, 0) as they are; (-1, -1) or
    (>= 0, != 0) -> (left, 0) with a warning; anything else is an error.
    no_mask, padding, arbitrary: None -> (-1, -1); (-1, -1) and (>= 0, >= 0) as they are;
    (-1, 0) -> (-1, -1) with a warning (no window, not a causal band); anything else (one
    unbounded side) is an error.
    """
    causal = mask_type in CAUSAL_MASK_TYPES
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise _err(f"window_size must be a pair of ints, got {window_size!r}") from None
    if causal:
        if (left, right) == (-1, 0) or (left >= 0 and right == 0):
            return left, right
        if (left, right) == (-1, -1) or left >= 0:  # any right side, as TE (utils.py:3009-3011)
            warnings.warn(
                f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={mask_type}",
                stacklevel=4,
            )
            return left, 0
        raise _err(
            f"window_size={window_size!r} conflicts with attn_mask_type={mask_type!r}: "
            "causal types take (-1, 0) or (>=0, 0)"
        )
    if (left, right) == (-1, -1) or (left >= 0 and right >= 0):
        return left, right
    if (left, right) == (-1, 0):
        warnings.warn(
            f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={mask_type}",
            stacklevel=4,
        )
        return -1, -1
    raise _err(
        f"window_size={window_size!r} is not valid for attn_mask_type={mask_type!r}: "
        "use (-1, -1) or (>=0, >=0)"
    )


def _bottom_right(mask_type: str, bottom_right_diagonal) -> bool:
    """The alignment of the causal band, window and alibi, as TE 2.20.2's
    DotProductAttention.forward resolves it (dot_product_attention.py:2398-2406): forced to
    False for causal/padding_causal and to True for the *_bottom_right types; for the other
    types the argument decides, None meaning True."""
    if mask_type in TOP_LEFT_MASK_TYPES:  # every other type aligns bottom-right by default
        return False
    if mask_type in ("causal_bottom_right", "padding_causal_bottom_right"):
        return True
    return True if bottom_right_diagonal is None else bool(bottom_right_diagonal)


def _lengths(source, cu_seqlens_q, cu_seqlens_kv, attention_mask):
    """Per-batch lengths (b,) int64 of q and kv, or (None, None)."""
    if source == "cu_seqlens":
        return (
            (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long(),
            (cu_seqlens_kv[1:] - cu_seqlens_kv[:-1]).long(),
        )
    if source == "mask":  # [b, 1, 1, s], True = padding: the length counts the False entries
        pair = isinstance(attention_mask, (tuple, list))
        mask_q, mask_kv = attention_mask if pair else (attention_mask, attention_mask)
        return (~mask_q).sum(dim=(1, 2, 3)), (~mask_kv).sum(dim=(1, 2, 3))
    return None, None
