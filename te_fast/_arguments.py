"""te_fast's own argument handling: validate one attention call and gather it into a `Call`.

te_ref has its own (te_ref/config.py), written independently, so that a misreading of the SPEC in
either shows up against the other; the two share only the error texts. This one sits on the eager
hot path and inside torch.compile graphs, hence:
- it reads shapes, dtypes, plain ints and None-ness, never tensor values (no host sync);
- the common call (no thd, no padding, no bias, no window) takes a handful of branches and no
  helper calls; the rarer checks live in helpers;
- it keeps no state: module-level tables are constants, nothing is cached between calls.
"""

from __future__ import annotations

import re
import warnings
from typing import NamedTuple

import torch

# The qkv_layout strings of SPEC §1: layout -> (q format, kv format). Packing does not matter here:
# packed q, k, v arrive as strided views with the shapes of separate tensors.
_FORMATS = {
    "sb3hd": ("sbhd", "sbhd"), "sbh3d": ("sbhd", "sbhd"), "sbhd_sb2hd": ("sbhd", "sbhd"),
    "sbhd_sbh2d": ("sbhd", "sbhd"), "sbhd_sbhd_sbhd": ("sbhd", "sbhd"),
    "bs3hd": ("bshd", "bshd"), "bsh3d": ("bshd", "bshd"), "bshd_bs2hd": ("bshd", "bshd"),
    "bshd_bsh2d": ("bshd", "bshd"), "bshd_bshd_bshd": ("bshd", "bshd"),
    "t3hd": ("thd", "thd"), "th3d": ("thd", "thd"), "thd_t2hd": ("thd", "thd"),
    "thd_th2d": ("thd", "thd"), "thd_thd_thd": ("thd", "thd"),
    "sbhd_bshd_bshd": ("sbhd", "bshd"), "bshd_sbhd_sbhd": ("bshd", "sbhd"),
    "thd_bshd_bshd": ("thd", "bshd"), "thd_sbhd_sbhd": ("thd", "sbhd"),
}  # fmt: skip
ATTN_MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
_PADDING = ("padding", "padding_causal", "padding_causal_bottom_right")
_CAUSAL = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")
_TOP_LEFT = ("causal", "padding_causal")  # always top-left (TE forces it)
_BOTTOM_RIGHT = ("causal_bottom_right", "padding_causal_bottom_right")  # always bottom-right
# The dtypes of query_layer/key_layer/value_layer: those of te_fast's softmax ops (SPEC §3).
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = "torch.float16, torch.bfloat16 or torch.float32"
# The conversion op's own message for a sequence longer than max_seqlen (csrc/checks.h).
_TOO_LONG = re.compile(r": sequence (\d+) has length (\d+) > max_seqlen = (\d+)")


class Call(NamedTuple):
    """One attention call, validated: the static configuration and the tensors it needs."""

    q_format: str  # "sbhd" | "bshd" | "thd"
    kv_format: str
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
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_kv: torch.Tensor | None  # cu_seqlens_q when the call gave none
    lengths_q: torch.Tensor | None  # (b,) on the device for padded/ragged calls, else None
    lengths_kv: torch.Tensor | None
    attention_mask: torch.Tensor | tuple | None
    bias: torch.Tensor | None
    alibi_slopes: torch.Tensor | None  # user slopes; None = the default slopes
    softmax_offset: torch.Tensor | None  # the forward argument, else the module's parameter


def _err(msg: str) -> ValueError:
    return ValueError(f"dot_product_attention: {msg}")


def _batch_and_seq(fmt: str, shape) -> tuple:
    """(b, s) of a bshd/sbhd tensor's shape; (None, None) for thd (its arguments give them)."""
    if fmt == "bshd":
        return shape[0], shape[1]
    if fmt == "sbhd":
        return shape[1], shape[0]
    return None, None


def resolve(
    q, k, v, qkv_layout, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
    attn_mask_type, attention_mask, window_size, bottom_right_diagonal, bias_type, bias,
    alibi_slopes, softmax_type, softmax_offset, offset_parameter, attention_type, softmax_scale,
) -> Call:  # fmt: skip
    """Validate one call (ValueError naming the problem) and return it as one `Call`.

    Positional, in UnfusedDotProductAttention.forward's order (then the module's softmax type,
    the offset argument and parameter, attention type and scale): this runs on every call.
    """
    try:
        q_format, kv_format = _FORMATS[qkv_layout]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown qkv_layout {qkv_layout!r}; expected one of {sorted(_FORMATS)}"
        ) from None
    if attn_mask_type not in ATTN_MASK_TYPES:
        raise _err(f"unknown attn_mask_type {attn_mask_type!r}; expected one of {ATTN_MASK_TYPES}")
    if bias_type not in BIAS_TYPES:
        raise _err(f"unknown core_attention_bias_type {bias_type!r}; expected one of {BIAS_TYPES}")
    if softmax_type not in SOFTMAX_TYPES:
        raise _err(f"unknown softmax_type {softmax_type!r}; expected one of {SOFTMAX_TYPES}")
    if attention_type != "self" and attention_type != "cross":
        raise _err(f"attention_type must be 'self' or 'cross', got {attention_type!r}")

    # ---- shapes: (s, b) from sbhd/bshd tensors; a thd side takes them from its arguments below
    qs, ks, vs = q.shape, k.shape, v.shape
    if len(qs) != (3 if q_format == "thd" else 4):
        raise _rank_error(q_format, qs, "query_layer")
    if len(ks) != (3 if kv_format == "thd" else 4):
        raise _rank_error(kv_format, ks, "key_layer")
    if len(vs) != len(ks):
        raise _rank_error(kv_format, vs, "value_layer")
    bq, sq = _batch_and_seq(q_format, qs)
    bk, skv = _batch_and_seq(kv_format, ks)
    h, dqk, hg, dv = qs[-2], qs[-1], ks[-2], vs[-1]
    if ks[-1] != dqk:
        raise _err(f"query and key head dims differ: {dqk} vs {ks[-1]}")
    if vs[-2] != hg or vs[:-2] != ks[:-2]:
        raise _err(
            f"key_layer {tuple(ks)} and value_layer {tuple(vs)} must agree "
            "in everything but the head dim"
        )
    if hg == 0 or h % hg != 0:
        raise _err(f"query heads ({h}) must be a multiple of key/value heads ({hg}) (GQA/MQA)")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise _err(f"query/key/value dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in DTYPES:
        raise _err(
            f"query_layer must have dtype {_DTYPE_NAMES} (key_layer and value_layer share it), "
            f"got {q.dtype} {tuple(qs)}"
        )

    # ---- sequence lengths: "cu_seqlens", "mask" or None (every position is real)
    lengths_from = None
    if q_format == "thd":  # thd always respects sequence boundaries, and takes padding types only
        if attn_mask_type not in _PADDING:
            raise _err(
                f"attn_mask_type={attn_mask_type!r} is not valid for qkv_layout "
                f"{qkv_layout!r}: a thd q takes padding, padding_causal or "
                "padding_causal_bottom_right"
            )
        bq, sq, bk, skv = _ragged(
            qkv_layout, kv_format, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, bk, skv
        )
        lengths_from = "cu_seqlens"
    if bq != bk:
        raise _err(f"query batch ({bq}) and key/value batch ({bk}) differ")
    if lengths_from is None and attn_mask_type in _PADDING:
        lengths_from = _padding_source(
            attn_mask_type, attention_mask, cu_seqlens_q, cu_seqlens_kv, bq, sq, skv,
            attention_type,
        )  # fmt: skip
    elif attn_mask_type == "arbitrary":
        _check_arbitrary_mask(attention_mask, bq, h, sq, skv)
    elif attention_mask is not None and q_format != "thd":
        raise _err(
            f"attention_mask is only used with padding* and 'arbitrary' mask types, not "
            f"{attn_mask_type!r}; pass attention_mask=None"
        )
    if q_format == "thd" and attention_mask is not None and attn_mask_type != "arbitrary":
        raise _err("thd layouts take sequence lengths from cu_seqlens, not attention_mask")

    # ---- bias, alibi slopes, softmax offset
    if bias is not None or bias_type != "no_bias" or alibi_slopes is not None:
        _check_bias(bias_type, bias, alibi_slopes, bq, h, sq, skv, q.dtype)
    if softmax_type == "learnable" and softmax_offset is None and offset_parameter is None:
        raise _err(
            "softmax_type='learnable' needs softmax_offset ([h] or [1, h, 1, 1]); pass it or "
            "construct the module with num_attention_heads"
        )
    if softmax_offset is not None:
        _check_offset(softmax_type, softmax_offset, h)

    # ---- band: window and alignment
    causal = attn_mask_type in _CAUSAL
    if window_size is None:
        window = (-1, 0) if causal else (-1, -1)
    else:
        window = _window(attn_mask_type, causal, window_size)
    if attn_mask_type in _TOP_LEFT:  # the type decides where it names an alignment
        bottom_right = False
    elif attn_mask_type in _BOTTOM_RIGHT or bottom_right_diagonal is None:
        bottom_right = True
    else:
        bottom_right = bool(bottom_right_diagonal)

    # ---- tensors: the kv fallback, per-batch lengths as device tensors (no host sync)
    cu_kv = cu_seqlens_kv if cu_seqlens_kv is not None else cu_seqlens_q
    lengths_q = lengths_kv = None
    if lengths_from == "cu_seqlens":
        lengths_q = cu_seqlens_q[1:] - cu_seqlens_q[:-1]  # (b,)
        lengths_kv = cu_kv[1:] - cu_kv[:-1]  # (b,)
    elif lengths_from == "mask":
        if isinstance(attention_mask, (tuple, list)):
            lengths_q = (~attention_mask[0]).sum(dim=(1, 2, 3))  # (b,)
            lengths_kv = (~attention_mask[1]).sum(dim=(1, 2, 3))  # (b,)
        else:  # self attention: one mask for both sides
            lengths_q = lengths_kv = (~attention_mask).sum(dim=(1, 2, 3))  # (b,)

    return Call(
        q_format, kv_format, attn_mask_type, bq, sq, skv, h, hg, dqk, dv,
        qs[0] if q_format == "thd" else None, causal, window, bottom_right, bias_type,
        softmax_type, dqk**-0.5 if softmax_scale is None else softmax_scale,
        cu_seqlens_q, cu_kv, lengths_q, lengths_kv, attention_mask, bias, alibi_slopes,
        softmax_offset if softmax_offset is not None else offset_parameter,
    )  # fmt: skip


def _rank_error(fmt, shape, what) -> ValueError:
    want = 3 if fmt == "thd" else 4
    return _err(f"{what} in {fmt} must be {want}-D, got shape {tuple(shape)}")


def _ragged(qkv_layout, kv_format, cu_q, cu_kv, max_q, max_kv, bk, skv):
    """(bq, sq, bk, skv) of a call with thd q: b from cu_seqlens, s from max_seqlen."""
    if cu_q is None:
        raise _err(f"qkv_layout {qkv_layout!r} needs cu_seqlens_q (int32 [b + 1])")
    bq = _check_cu_seqlens("cu_seqlens_q", cu_q, None)
    sq = _check_max_seqlen("max_seqlen_q", max_q, "query_layer")
    if kv_format == "thd":
        if cu_kv is None:
            raise _err(f"qkv_layout {qkv_layout!r} needs cu_seqlens_kv (int32 [b + 1])")
        bk = _check_cu_seqlens("cu_seqlens_kv", cu_kv, None)
        skv = _check_max_seqlen("max_seqlen_kv", max_kv, "key_layer/value_layer")
    else:  # a padded kv cache: cu_seqlens_kv holds its filled lengths
        if cu_kv is None:
            raise _err(
                f"qkv_layout {qkv_layout!r} needs cu_seqlens_kv: the filled length of each "
                "sequence of the kv cache"
            )
        _check_cu_seqlens("cu_seqlens_kv", cu_kv, bk)
    return bq, sq, bk, skv


def _check_cu_seqlens(name, cu, b):
    if not isinstance(cu, torch.Tensor):
        raise _err(f"{name} must be an int32 tensor of shape [b + 1], got {type(cu).__name__}")
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 1:
        raise _err(
            f"{name} must be an int32 tensor of shape [b + 1], got {cu.dtype} {tuple(cu.shape)}"
        )
    if b is not None and cu.shape[0] != b + 1:
        raise _err(f"{name} must have shape [b + 1] = [{b + 1}], got {tuple(cu.shape)}")
    return cu.shape[0] - 1


def max_seqlen_error(error: RuntimeError, side: str) -> ValueError | None:
    """The module's error for the conversion op's "sequence x has length n > max_seqlen = m"
    on the thd tensors of ``side`` ("q" or "kv"): a ValueError naming the forward arguments
    (max_seqlen_q/max_seqlen_kv and cu_seqlens_q/cu_seqlens_kv) and the values; None for any
    other error. The op raises it on the CPU, and on CUDA under TE_FAST_DEBUG_CHECKS=1; the
    module catches it only after the op failed, so the valid path pays nothing for it."""
    found = _TOO_LONG.search(str(error))
    if found is None:
        return None
    x, length, limit = found.groups()
    return _err(
        f"max_seqlen_{side} must be at least the longest sequence of cu_seqlens_{side}, got "
        f"max_seqlen_{side} = {limit} < {length}, the length of sequence {x}"
    )


def _check_max_seqlen(name, value, what):
    if value is None:
        raise _err(f"{name} is required for the thd format of {what} (a plain int)")
    if isinstance(value, (torch.Tensor, bool)) or value < 0:
        raise _err(f"{name} must be a non-negative plain int, got {value!r}")
    return value


def _padding_source(mask_type, attention_mask, cu_q, cu_kv, b, sq, skv, attention_type):
    """Where a padding type on sbhd/bshd takes its lengths from: "mask" or "cu_seqlens"."""
    if attention_mask is not None:
        _check_padding_mask(attention_mask, b, sq, skv)
        return "mask"
    if cu_q is not None:
        _check_cu_seqlens("cu_seqlens_q", cu_q, b)
        if cu_kv is None and sq != skv:
            raise _err("cross attention with padding needs cu_seqlens_kv as well")
        if cu_kv is not None:
            _check_cu_seqlens("cu_seqlens_kv", cu_kv, b)
        return "cu_seqlens"
    raise _err(
        f"attn_mask_type={mask_type!r} needs the sequence lengths: attention_mask "
        "([b, 1, 1, s] bool, True = padding; a (q, kv) pair for cross attention) or "
        "cu_seqlens_q/cu_seqlens_kv"
    )


def _check_padding_mask(mask, b, sq, skv):
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
                f"got {_describe(m)}"
            )


def _describe(t) -> str:
    """A tensor argument as an error message shows what was received: dtype and shape."""
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} {tuple(t.shape)}"
    return type(t).__name__


def _check_arbitrary_mask(mask, b, h, sq, skv):
    if mask is None:
        raise _err("attn_mask_type='arbitrary' needs attention_mask: a bool tensor, True = masked")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise _err(
            "attention_mask for attn_mask_type='arbitrary' must be torch.bool (True = masked), "
            f"got {_describe(mask)}"
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


def _check_bias(bias_type, bias, alibi_slopes, b, h, sq, skv, dtype):
    if bias_type == "pre_scale_bias" or bias_type == "post_scale_bias":
        if bias is None:
            raise _err(f"core_attention_bias_type={bias_type!r} needs core_attention_bias")
        shape = tuple(bias.shape)
        if bias.dtype != dtype:  # TE's fused attention: the bias has q's dtype
            raise _err(
                f"core_attention_bias must have the dtype of query_layer, {dtype}, "
                f"got {bias.dtype} {shape}"
            )
        if not (
            len(shape) == 4
            and shape[0] in (1, b)
            and shape[1] in (1, h)
            and shape[2] in (1, sq)
            and shape[3] == skv
        ):
            raise _err(
                f"core_attention_bias must have shape [b|1, h|1, sq|1, skv] = "
                f"[{b}|1, {h}|1, {sq}|1, {skv}], got {shape}"
            )
    elif bias is not None:
        raise _err(f"core_attention_bias given with core_attention_bias_type={bias_type!r}")
    if alibi_slopes is not None:
        if bias_type != "alibi":
            raise _err("alibi_slopes given without core_attention_bias_type='alibi'")
        if tuple(alibi_slopes.shape) not in ((h,), (b, h)):
            raise _err(
                f"alibi_slopes must have shape [{h}] or [{b}, {h}], got {tuple(alibi_slopes.shape)}"
            )


def _check_offset(softmax_type, offset, h):
    if softmax_type == "vanilla":
        raise _err("softmax_offset given with softmax_type='vanilla' (it would be ignored)")
    if tuple(offset.shape) not in ((h,), (1, h, 1, 1)):
        raise _err(
            f"softmax_offset must have shape [{h}] or [1, {h}, 1, 1], got {tuple(offset.shape)}"
        )


def _window(mask_type, causal, window_size):
    """(left, right) of a given window_size, normalised as TE's check_set_window_size does
    (SPEC §2.3): a causal type takes (-1, 0) or (>= 0, 0) and turns (-1, -1) or (>= 0, any)
    into (left, 0) with a warning; the other types take (-1, -1) or (>= 0, >= 0) and turn
    (-1, 0) into (-1, -1) with a warning. Anything else is an error."""
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise _err(f"window_size must be a pair of ints, got {window_size!r}") from None
    if causal:
        if right == 0 and left >= -1:
            return left, 0
        if left >= 0 or (left == -1 and right == -1):
            warnings.warn(
                f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={mask_type}",
                stacklevel=3,
            )
            return left, 0
        raise _err(
            f"window_size={window_size!r} conflicts with attn_mask_type={mask_type!r}: "
            "causal types take (-1, 0) or (>=0, 0)"
        )
    if left >= 0 and right >= 0 or left == right == -1:
        return left, right
    if left == -1 and right == 0:
        warnings.warn(
            f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={mask_type}",
            stacklevel=3,
        )
        return -1, -1
    raise _err(
        f"window_size={window_size!r} is not valid for attn_mask_type={mask_type!r}: "
        "use (-1, -1) or (>=0, >=0)"
    )
