"""`--impl flex_attention`: torch.nn.attention.flex_attention, every mask and bias as mods.

Every case is translated to one padded (b, h, s, d) problem: thd tensors are gathered into their
padded batch, and the sequence lengths, causal band, window and arbitrary mask become the
`mask_mod`; biases, ALiBi and the softmax offset become the `score_mod` (the off-by-one and
learnable softmaxes as one extra key column, an attention sink, whose score is 0 or the head's
offset and whose value is 0). The adapter parses TE's arguments itself (SPEC §1-2), not through
te_ref, so that the reference and the adapter do not share a mistake.

On the CPU, torch 2.13's public `flex_attention` refuses inputs that require grad ("does not
support backward on CPU") and refuses to return the max scores, so there the adapter calls the
higher-order op underneath it, `torch._higher_order_ops.flex_attention.flex_attention`, in eager
mode: torch's dense math forward and backward of flex attention (what the public function runs
in eager mode too, after the same checks). On CUDA it calls the public function compiled
(`torch.compile(flex_attention)`: the generated Triton kernel).
"""

from __future__ import annotations

import math
import warnings

import torch

from te_conformance.suites.adapters.base import Adapter, Rule, Support, distribution_version
from te_ref.layouts import BOTTOM_RIGHT_MASK_TYPES, CAUSAL_MASK_TYPES, TOP_LEFT_MASK_TYPES


def _window(mask_type, causal, window_size):
    """(left, right) as TE's check_set_window_size normalises window_size (SPEC §2.3): a causal
    type takes (-1, 0) or (>= 0, 0) and turns (-1, -1) or (>= 0, any) into (left, 0) with a
    warning; the other types take (-1, -1) or (>= 0, >= 0) and turn (-1, 0) into (-1, -1) with
    a warning; anything else is refused."""
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    left, right = (int(w) for w in window_size)
    if causal:
        if right == 0 and left >= -1:
            return left, 0
        if left >= 0 or left == right == -1:
            warnings.warn(
                f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={mask_type}",
                stacklevel=3,
            )
            return left, 0
    elif left >= 0 and right >= 0 or left == right == -1:
        return left, right
    elif left == -1 and right == 0:
        warnings.warn(
            f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={mask_type}",
            stacklevel=3,
        )
        return -1, -1
    raise ValueError(f"window_size={window_size!r} is not valid for attn_mask_type={mask_type!r}")


def default_alibi_slopes(h: int) -> list[float]:
    """ALiBi's default slopes (SPEC §2): 2**(-8k/n), k = 1..n, n = 2**floor(log2 h), then the
    odd terms of the 2n series for the remaining heads."""
    n = 2 ** math.floor(math.log2(h))
    return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)] + [
        2.0 ** (-4.0 * k / n) for k in range(1, 2 * (h - n), 2)
    ]


class FlexAttention(Adapter):
    """torch.nn.attention.flex_attention with mask_mod / score_mod translations of TE's API."""

    def version(self):
        return distribution_version("torch")

    name = "flex_attention"
    # dropout: flex_attention has none. validates_arguments: the adapter translates valid cases
    # only. capturable / sync_free: thd inputs are gathered with host-side lengths.
    # deterministic: torch's dense math on the CPU (checked there); the compiled Triton kernel on
    # CUDA was not run here, so not claimed there.
    support = Support(
        capabilities=("deterministic", "exact_one_key"),
        capability_devices={"deterministic": ("cpu",), "exact_one_key": ("cpu",)},
        rules=(
            Rule(lambda c: c.return_max_logit and c.softmax_type != "vanilla",
                 "max_logit with a softmax offset: the adapter expresses the offset as an extra "
                 "key column, which flex's max scores include", "max_logit"),
        ),
        why={
            "deterministic": "not claimed on CUDA: the compiled Triton kernel's backward was not "
            "run by this project",
            "dropout": "flex_attention has no attention dropout",
            "dropout_ctx": "flex_attention has no attention dropout (nor an RNG context)",
            "validates_arguments": "the adapter translates valid cases only; flex_attention "
            "checks shapes, not TE's arguments",
            "capturable": "not claimed: the adapter reads thd sequence lengths on the host",
            "traceable": "on the CPU the adapter calls flex's higher-order op itself (the public "
            "function refuses backward there), and dynamo cannot trace that call from user code "
            "(InternalTorchDynamoError: too many values to unpack); the compiled CUDA path is "
            "not claimed either (thd lengths are read on the host)",
            "sync_free": "the adapter reads thd sequence lengths on the host "
            "(cu_seqlens.tolist())",
            "fp8": "flex_attention has no FP8 recipe or scaling state",
        },
    )  # fmt: skip

    def unavailable_reason(self, device):
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as e:
            return f"torch {torch.__version__} has no torch.nn.attention.flex_attention: {e}"
        return None

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        if dropout or dropout_ctx is not None:
            raise NotImplementedError(self.declines(needs=("dropout",))[0].text)
        return FlexDotProductAttention(
            case.h, scale, case.softmax_type, case.attention_type, case.return_max_logit
        )


class FlexDotProductAttention(torch.nn.Module):
    """TE's DotProductAttention forward arguments on top of flex_attention."""

    def __init__(self, h, scale, softmax_type="vanilla", attention_type="self",
                 return_max_logit=False):  # fmt: skip
        super().__init__()
        self.h, self.scale, self.softmax_type = h, scale, softmax_type
        self.attention_type, self.return_max_logit = attention_type, return_max_logit

    def forward(
        self, q, k, v, *, qkv_layout, attn_mask_type="causal", cu_seqlens_q=None,
        cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None, attention_mask=None,
        window_size=None, bottom_right_diagonal=None, core_attention_bias_type="no_bias",
        core_attention_bias=None, alibi_slopes=None, softmax_offset=None,
    ):  # fmt: skip
        from te_ref.layouts import parse_layout  # the layout names' table only

        layout = parse_layout(qkv_layout)
        qf, kvf = layout.q_format, layout.kv_format
        device = q.device

        # -> (b, h, s, d), and the per-batch lengths (None: every position is real)
        lq = lkv = None
        if qf == "thd":
            b = cu_seqlens_q.shape[0] - 1
            qh, lq = _thd_to_padded(q, cu_seqlens_q, b, max_seqlen_q)
        else:
            qh = _heads_first(q, qf)
            b = qh.shape[0]
        if kvf == "thd":
            kh, lkv = _thd_to_padded(k, cu_seqlens_kv, b, max_seqlen_kv)
            vh, _ = _thd_to_padded(v, cu_seqlens_kv, b, max_seqlen_kv)
        else:
            kh, vh = _heads_first(k, kvf), _heads_first(v, kvf)
            if qf == "thd":  # a kv cache: cu_seqlens_kv gives each sequence's filled length
                lkv = cu_seqlens_kv.diff().long()
        sq, skv = qh.shape[2], kh.shape[2]
        pad_q = pad_kv = None  # (b, s) True = padding: a padding mask masks what it marks
        if qf != "thd" and attn_mask_type.startswith("padding"):
            if attention_mask is not None:  # ([b, 1, 1, s], True = padding, or a (q, kv) pair)
                pair = isinstance(attention_mask, (tuple, list))
                mq, mkv = attention_mask if pair else (attention_mask, attention_mask)
                pad_q, pad_kv = mq.reshape(b, sq), mkv.reshape(b, skv)  # left padding too
                lq, lkv = (~pad_q).sum(dim=1), (~pad_kv).sum(dim=1)  # for the alignment
            else:  # lengths from cu_seqlens (cu_seqlens_kv defaults to the q lengths)
                lq = cu_seqlens_q.diff().long()
                lkv = cu_seqlens_kv.diff().long() if cu_seqlens_kv is not None else lq
        if lq is None:
            lq = torch.full((b,), sq, dtype=torch.long, device=device)
        if lkv is None:
            lkv = torch.full((b,), skv, dtype=torch.long, device=device)

        causal = attn_mask_type in CAUSAL_MASK_TYPES
        left, right = _window(attn_mask_type, causal, window_size)
        if attn_mask_type in TOP_LEFT_MASK_TYPES:  # a causal type names its alignment (SPEC §2.3)
            bottom_right = False
        elif attn_mask_type in BOTTOM_RIGHT_MASK_TYPES or bottom_right_diagonal is None:
            bottom_right = True
        else:
            bottom_right = bool(bottom_right_diagonal)
        diag = (lkv - lq) if bottom_right else torch.zeros_like(lq)  # (b,)
        arbitrary = attention_mask if attn_mask_type == "arbitrary" else None
        sink = self.softmax_type != "vanilla"
        if sink:  # the attention sink: one more key, value 0, score 0 or the head's offset
            kh = torch.cat([kh, kh.new_zeros(*kh.shape[:2], 1, kh.shape[3])], dim=2)
            vh = torch.cat([vh, vh.new_zeros(*vh.shape[:2], 1, vh.shape[3])], dim=2)

        def mask_mod(bi, hi, qi, ki):
            if pad_q is None:
                keep = (qi < lq[bi]) & (ki < lkv[bi])
            else:
                kc = ki.clamp(max=skv - 1)  # the sink column (ki == skv) is kept below
                keep = ~pad_q[bi, qi] & ~pad_kv[bi, kc]
            if right >= 0:
                keep = keep & (ki <= qi + diag[bi] + right)
            if left >= 0:
                keep = keep & (ki >= qi + diag[bi] - left)
            if arbitrary is not None:
                m = arbitrary.expand(b, self.h, sq, skv)
                keep = keep & ~m[bi, hi, qi, ki.clamp(max=skv - 1)]
            if sink:
                keep = keep | (ki == skv)
            return keep

        # score_mod's tensors go in as buffers (the CPU path needs them explicit to take their
        # gradients): bias (b|1, h|1, sq|1, skv) expanded, slopes (b, h), offset (h,)
        scale = self.scale if self.scale is not None else qh.shape[-1] ** -0.5
        buffers: dict[str, torch.Tensor] = {}
        bias_type = core_attention_bias_type
        if bias_type in ("pre_scale_bias", "post_scale_bias"):
            bias = core_attention_bias.expand(b, self.h, sq, skv)
            buffers["bias"] = bias * scale if bias_type == "pre_scale_bias" else bias
        elif bias_type == "alibi":
            slopes = alibi_slopes
            if slopes is None:
                slopes = torch.tensor(default_alibi_slopes(self.h), device=device)
            buffers["slopes"] = slopes.to(torch.float32).reshape(-1, self.h).expand(b, self.h)
        if self.softmax_type == "learnable":
            buffers["offset"] = softmax_offset.to(torch.float32)
        names = list(buffers)

        def score_mod(score, bi, hi, qi, ki, *values):
            got = dict(zip(names, values))
            kc = ki.clamp(max=skv - 1)
            if "bias" in got:
                score = score + got["bias"][bi, hi, qi, kc]
            if "slopes" in got:
                score = score - got["slopes"][bi, hi] * (qi - kc + diag[bi]).abs()
            if sink:
                offset = got["offset"][hi] if "offset" in got else torch.zeros_like(score)
                score = torch.where(ki == skv, offset.to(score.dtype), score)
            return score

        out, max_scores = _flex(
            qh, kh, vh, score_mod, mask_mod, [buffers[n] for n in names], scale,
            heads=self.h if arbitrary is not None else None, want_max=self.return_max_logit,
        )  # fmt: skip
        # (b, h, sq, dv) -> the layout's output shape
        dv = out.shape[-1]
        if qf == "sbhd":
            out = out.permute(2, 0, 1, 3).reshape(sq, b, self.h * dv)
        elif qf == "bshd":
            out = out.permute(0, 2, 1, 3).reshape(b, sq, self.h * dv)
        else:
            out = _padded_to_thd(out.permute(0, 2, 1, 3), cu_seqlens_q, q.shape[0])
            out = out.reshape(q.shape[0], self.h * dv)
        if not self.return_max_logit:
            return out
        return out, max_scores.amax(dim=(0, 2)).to(torch.float32)  # (h,)


def _flex(q, k, v, score_mod, mask_mod, buffers, scale, heads, want_max):
    """(out (b, h, sq, dv), max scores (b, h, sq) or None) from flex attention."""
    from torch.nn.attention import flex_attention as fa

    b, h, sq, skv = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    block_mask = fa.create_block_mask(mask_mod, b, heads, sq, skv, device=q.device.type)
    if q.device.type == "cpu":
        from torch._higher_order_ops.flex_attention import flex_attention as flex_hop

        out, _, max_scores = flex_hop(
            q, k, v, score_mod, block_mask.as_tuple(), scale, {}, tuple(buffers), ()
        )
        # the math path keeps its statistics in log2 units (the public function converts back)
        return out, max_scores * math.log(2) if want_max else None

    def closed(score, bi, hi, qi, ki):
        return score_mod(score, bi, hi, qi, ki, *buffers)

    compiled = _compiled()
    aux = fa.AuxRequest(max_scores=True) if want_max else None
    result = compiled(
        q, k, v, score_mod=closed, block_mask=block_mask, scale=scale,
        enable_gqa=h != k.shape[1], return_aux=aux,
    )  # fmt: skip
    if want_max:
        out, aux_out = result
        return out, aux_out.max_scores
    return result, None


_COMPILED: list = []


def _compiled():
    if not _COMPILED:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED.append(torch.compile(flex_attention, dynamic=False))
    return _COMPILED[0]


def _heads_first(t: torch.Tensor, fmt: str) -> torch.Tensor:
    return t.permute(1, 2, 0, 3) if fmt == "sbhd" else t.permute(0, 2, 1, 3)  # (b, h, s, d)


def _thd_to_padded(t, cu_seqlens, b, s):
    """(t, h, d) -> (b, h, s, d) with zeros past each length, and the lengths (b,)."""
    lengths = cu_seqlens.diff().long()
    pos = torch.arange(s, device=t.device)
    valid = pos[None, :] < lengths[:, None]  # (b, s)
    index = torch.where(valid, cu_seqlens[:-1, None].long() + pos[None, :], 0)  # (b, s)
    padded = torch.where(valid[..., None, None], t[index], 0)  # (b, s, h, d)
    return padded.permute(0, 2, 1, 3), lengths


def _padded_to_thd(o, cu_seqlens, t):
    """(b, s, h, dv) -> (t, h, dv); tokens past cu_seqlens[-1] are 0."""
    tokens = torch.arange(t, device=o.device)
    batch = torch.searchsorted(cu_seqlens[1:].long(), tokens, right=True)  # (t,)
    real = tokens < cu_seqlens[-1]
    batch = torch.where(real, batch, 0)
    pos = torch.where(real, tokens - cu_seqlens[:-1].long()[batch], 0)
    return torch.where(real[:, None, None], o[batch, pos], 0)
