"""UnfusedDotProductAttention: BMM1 -> te_fast softmax op -> BMM2, in any SPEC layout."""

from __future__ import annotations

import collections
import contextlib
from types import MappingProxyType

import torch

from te_fast import _attention_core, _eager_softmax, ops
from te_fast import fp8 as fp8_lib
from te_fast._arguments import _PADDING as _PADDING_TYPES
from te_fast._arguments import SOFTMAX_TYPES, Call, max_seqlen_error, resolve
from te_fast._registry import SOFTMAX_KINDS

__all__ = ["UnfusedDotProductAttention"]

# Slices of 256 MiB of scores: at b16 h32 s2048 bf16 (4 GiB of scores) one batch element each,
# whose GEMMs still fill an H200.
DEFAULT_SCORE_CHUNK_BYTES = 256 << 20
# Calls with fewer bytes of scores keep the ops path: there the step is bound by host time, and
# the eager core's Python costs more than the copies it saves (at b2 h16 s128 d64 it was ~8%
# slower; at b16 h32 s2048 d128, 4 GiB of scores, it was ~10% faster with less than half the
# peak extra memory: the measurements are in docs/performance.md).
CORE_MIN_SCORE_BYTES = 64 << 20

# The ways a forward goes, counted per plain eager call in UnfusedDotProductAttention.
# dispatch_counts (traces are not counted: a compiled graph runs what its trace chose). The
# suites check that every path has a case (suites/te_fast/test_dispatch_paths.py).
DISPATCH_PATHS = (
    "fp8",  # the FP8 eager island
    *(f"ops:{kind}" for kind in SOFTMAX_KINDS),  # whole-tensor ops, by vanilla softmax op
    "ops:sink",  # off-by-one / learnable: the plain or masked op on one more column, in fp32
    *(f"core:{kind}" for kind in SOFTMAX_KINDS),  # the eager core, by softmax op
    "core:one_slice", "core:batch_slices", "core:head_slices",  # and by its slices
)  # fmt: skip


def _heads_first(t, fmt, cu_seqlens, b, s, side):
    """Any format -> (b, h, s, d); thd goes through the te_fast conversion op, whose error for a
    sequence longer than s comes out naming the forward arguments of ``side`` ("q" or "kv")."""
    if fmt == "sbhd":
        return t.permute(1, 2, 0, 3)  # (s, b, h, d) -> (b, h, s, d)
    if fmt == "bshd":
        return t.permute(0, 2, 1, 3)  # (b, s, h, d) -> (b, h, s, d)
    try:
        bshd = ops.convert_thd_to_bshd(t, cu_seqlens, b, s)  # (b, s, h, d)
    except RuntimeError as e:
        error = max_seqlen_error(e, side)
        if error is None:
            raise
        raise error from e
    return bshd.permute(0, 2, 1, 3)  # (b, h, s, d)


def _heads_first_qkv(call, q, k, v):
    """q (b, h, sq, dqk), k (b, hg, skv, dqk), v (b, hg, skv, dv)."""
    qh = _heads_first(q, call.q_format, call.cu_seqlens_q, call.b, call.sq, "q")
    kh = _heads_first(k, call.kv_format, call.cu_seqlens_kv, call.b, call.skv, "kv")
    vh = _heads_first(v, call.kv_format, call.cu_seqlens_kv, call.b, call.skv, "kv")
    return qh, kh, vh


def _repeat_kv(t, h):
    """GQA/MQA: (b, hg, s, d) -> (b, h, s, d), query head i reading kv head i // (h // hg)."""
    b, hg, s, d = t.shape
    if hg == h:
        return t
    return t[:, :, None].expand(b, hg, h // hg, s, d).reshape(b, h, s, d)


def _bmm(a, b):
    """BMM1/BMM2. fp16/bf16 go to cuBLAS as they are (fp32 accumulation). fp32 inputs accumulate
    in fp64: an fp32 GEMM's rounding is as large as the reference composite's own, so the
    error-ratio rule (k = 2) would pass or fail on summation-order luck; in fp64 the fp32 path
    is correctly rounded at the GEMM outputs, in forward and (through autograd) backward."""
    if a.dtype == torch.float32:
        return torch.matmul(a.double(), b.double()).float()
    return torch.matmul(a, b)


def _alibi_slopes(h, device):
    """Default ALiBi slopes computed on the device (no host-to-device copy, capture-safe)."""
    n = 1 << (h.bit_length() - 1)  # 2**floor(log2 h)
    k = torch.arange(1, n + 1, device=device, dtype=torch.float32)
    slopes = torch.exp2(-8.0 * k / n)
    if n < h:
        odd = torch.arange(1, 2 * (h - n), 2, device=device, dtype=torch.float32)
        slopes = torch.cat([slopes, torch.exp2(-4.0 * odd / n)])
    return slopes  # (h,)


class UnfusedDotProductAttention(torch.nn.Module):
    """Transformer Engine-style unfused attention on te_fast's custom ops.

    softmax_type="learnable" needs an offset per head: construct with num_attention_heads to own
    an ``nn.Parameter`` ``softmax_offset`` of shape [h] (initialised to zeros), or pass
    ``softmax_offset`` to forward (which then overrides the parameter).

    score_chunk_bytes (te_fast's own, not Transformer Engine's): fp16/bf16 calls (vanilla
    softmax, no bias, no dropout in training, no max_logit) with at least CORE_MIN_SCORE_BYTES
    (64 MiB) of scores run BMM1 -> softmax -> BMM2 and the backward as one autograd node on the
    strided inputs (te_fast/_attention_core.py), in slices of at most this many bytes of [b, h,
    sq, skv] scores along the batch (or head) axis, so that besides the saved probabilities only
    one slice's scores (or dP and dS) are alive. None: one slice. Default 256 MiB. Traces
    (torch.compile) run the same slices through the ops te_fast::attention_core and
    attention_core_backward; functorch transforms keep the whole-tensor ops. The core's backward
    does not support double backward.
    """

    score_chunk_bytes: int | None = DEFAULT_SCORE_CHUNK_BYTES
    core_min_score_bytes: int = CORE_MIN_SCORE_BYTES  # (tests set it to 0)
    # DISPATCH_PATHS -> plain eager forwards that took it, over every module (shared, never reset
    # here; the suites replace it with a fresh Counter to count their own calls)
    dispatch_counts: collections.Counter = collections.Counter()

    def __init__(
        self,
        softmax_scale: float | None,
        attention_type: str = "self",
        attention_dropout: float = 0.0,
        attention_dropout_ctx=contextlib.nullcontext,
        layer_number: int | None = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool = False,
        num_attention_heads: int | None = None,
        score_chunk_bytes: int | None = DEFAULT_SCORE_CHUNK_BYTES,
    ):
        super().__init__()
        if score_chunk_bytes is not None and (
            isinstance(score_chunk_bytes, bool)
            or not isinstance(score_chunk_bytes, int)
            or score_chunk_bytes <= 0
        ):
            raise ValueError(
                f"score_chunk_bytes must be a positive int or None, got {score_chunk_bytes!r}"
            )
        if score_chunk_bytes != DEFAULT_SCORE_CHUNK_BYTES:  # the default reads the class's
            self.score_chunk_bytes = score_chunk_bytes
        if softmax_type not in SOFTMAX_TYPES:
            raise ValueError(
                f"unknown softmax_type {softmax_type!r}; expected one of {SOFTMAX_TYPES}"
            )
        if attention_type not in ("self", "cross"):
            raise ValueError(f"attention_type must be 'self' or 'cross', got {attention_type!r}")
        if not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {attention_dropout}")
        self.softmax_scale = softmax_scale
        self.attention_type = attention_type
        self.attention_dropout = attention_dropout
        self.attention_dropout_ctx = attention_dropout_ctx
        self.layer_number = layer_number
        self.softmax_type = softmax_type
        self.return_max_logit = return_max_logit
        self._fp8_recipe = None
        self._fp8_roles: dict = {}
        if softmax_type == "learnable" and num_attention_heads is not None:
            self.softmax_offset = torch.nn.Parameter(torch.zeros(num_attention_heads))
        else:
            self.register_parameter("softmax_offset", None)

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        *,
        qkv_layout: str = "sbh3d",
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_kv: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_kv: int | None = None,
        attn_mask_type: str = "causal",
        attention_mask=None,
        window_size: tuple[int, int] | None = None,
        bottom_right_diagonal: bool | None = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        softmax_offset: torch.Tensor | None = None,
        fp8: bool = False,
        fp8_meta: dict | None = None,
        fp8_output: bool = False,
    ):
        """Attention in the SPEC §1 output shape; (out, max_logit [h]) with return_max_logit."""
        call = resolve(
            query_layer, key_layer, value_layer, qkv_layout, cu_seqlens_q, cu_seqlens_kv,
            max_seqlen_q, max_seqlen_kv, attn_mask_type, attention_mask, window_size,
            bottom_right_diagonal, core_attention_bias_type, core_attention_bias, alibi_slopes,
            self.softmax_type, softmax_offset, self.softmax_offset, self.attention_type,
            self.softmax_scale,
        )  # fmt: skip
        if fp8 or fp8_output:  # the eager island: exactly one graph break, here
            return _fp8_island(
                self, call, query_layer, key_layer, value_layer, fp8, fp8_meta, fp8_output
            )
        return self._attention(call, query_layer, key_layer, value_layer)

    def _count(self, *paths: str) -> None:
        """One more plain eager forward down each of ``paths`` (DISPATCH_PATHS); nothing in a
        trace (is_compiling is a constant there: the branch leaves no trace of its own)."""
        if not _eager_softmax._is_compiling():
            counts = self.dispatch_counts
            for path in paths:
                counts[path] += 1

    @property
    def fp8_state(self) -> MappingProxyType:
        """Read-only copies of the FP8 scaling state, by role (QKV, S, O, dO, dP, dQKV)."""
        return MappingProxyType({r: s.view() for r, s in self._fp8_roles.items()})

    def _fp8_forward(self, call: Call, q, k, v, fp8_enabled, fp8_meta, fp8_output):
        if not fp8_enabled:
            raise ValueError("fp8_output=True needs fp8=True")
        recipe = (fp8_meta or {}).get("recipe")
        if recipe is None:
            raise ValueError("fp8=True needs fp8_meta={'recipe': DelayedScaling(...) or "
                             "CurrentScaling(...)} (from te_fast.fp8)")  # fmt: skip
        unsupported = [
            what
            for what, bad in (
                (f"core_attention_bias_type={call.bias_type!r}", call.bias_type != "no_bias"),
                (f"softmax_type={call.softmax_type!r}", call.softmax_type != "vanilla"),
                ("attention_dropout > 0 in training", self.training and self.attention_dropout),
                ("return_max_logit", self.return_max_logit),
            )
            if bad
        ]
        if unsupported:
            raise NotImplementedError(f"te_fast FP8 attention does not support {unsupported}")
        if recipe != self._fp8_recipe:  # a new recipe starts from a fresh state
            self._fp8_recipe, self._fp8_roles = recipe, fp8_lib.make_state(recipe, q.device)
        qh, kh, vh = _heads_first_qkv(call, q, k, v)
        masked = self._mask(call, q.device)
        self._count("fp8")
        o, o_data, o_scale_inv = fp8_lib.FP8Attention.apply(
            qh, kh, vh, masked, call.scale, self._fp8_roles, self._softmax
        )
        out = self._output(call, o)
        if not fp8_output:
            return out
        return fp8_lib.to_float8(out, self._output(call, o_data), o_scale_inv)

    @classmethod
    def _softmax(cls, scores, masked, scale):
        if masked is None:
            return _eager_softmax.softmax("scaled_softmax_fwd", scores, None, scale)
        return cls._masked_softmax(scores, masked, scale)

    def _attention(self, call: Call, q, k, v):
        h, scale = call.h, call.scale
        qh, kh, vh = _heads_first_qkv(call, q, k, v)
        kh, vh = _repeat_kv(kh, h), _repeat_kv(vh, h)  # (b, h, skv, d): GQA/MQA

        kernel_causal = (
            call.causal and call.lengths_q is None and call.window[0] < 0
            and call.attn_mask_type != "arbitrary" and call.softmax_type == "vanilla"
            and not self.return_max_logit
        )  # fmt: skip
        masked = None if kernel_causal else self._mask(call, q.device)

        plan = self._core_plan(call, qh)
        kind = self._softmax_kind(call, kernel_causal, masked)
        if plan is not None:  # one autograd node (or op), no copies, slice by slice
            axis, bounds = plan
            split = "one_slice" if len(bounds) == 1 else ("batch_slices", "head_slices")[axis]
            self._count(f"core:{kind}", f"core:{split}")
            o = _attention_core.core(qh, kh, vh, masked, kind, scale, plan)
            return self._output(call, o)
        self._count("ops:sink" if call.softmax_type != "vanilla" else f"ops:{kind}")

        # BMM1 and bias; `softmax_scale` is what the softmax kernel still has to apply (in fp32).
        scores = _bmm(qh, kh.transpose(-2, -1))  # (b, h, sq, skv)
        softmax_scale = scale
        if call.bias_type == "pre_scale_bias":
            scores = scores + call.bias.to(scores.dtype)
        elif call.bias_type == "post_scale_bias":
            scores = scores * scale + call.bias.to(scores.dtype)
            softmax_scale = 1.0
        elif call.bias_type == "alibi":
            scores = scores * scale + self._alibi(call, q.device).to(scores.dtype)
            softmax_scale = 1.0

        if call.softmax_type != "vanilla":
            probs = self._sink_softmax(call, scores, softmax_scale, masked)
        else:
            probs = _attention_core.scores_softmax(kind, scores, masked, softmax_scale)

        if self.attention_dropout > 0.0:
            with self.attention_dropout_ctx():
                probs = torch.nn.functional.dropout(probs, self.attention_dropout, self.training)

        o = _bmm(probs, vh)  # (b, h, sq, dv)
        out = self._output(call, o)
        if not self.return_max_logit:
            return out
        logits = scores.float() * softmax_scale  # (b, h, sq, skv)
        if masked is not None:
            logits = logits.masked_fill(masked, float("-inf"))
        return out, logits.amax(dim=(0, 2, 3))  # (h,)

    def _core_plan(self, call, qh):
        """(axis, bounds) of the core's slices (_attention_core.chunk_bounds at
        score_chunk_bytes, one slice when that is None or the scores fit) for an fp16/bf16 call
        with a vanilla softmax, no bias, no dropout in training, no max_logit and at least
        core_min_score_bytes of scores, in plain eager calls and traces alike (not under
        functorch transforms: _attention_core.core_applies); None otherwise."""
        if not (
            qh.dtype in (torch.float16, torch.bfloat16) and call.softmax_type == "vanilla"
            and call.bias_type == "no_bias" and not self.return_max_logit
            and not (self.training and self.attention_dropout > 0.0)
            and _attention_core.core_applies()
        ):  # fmt: skip
            return None
        # Sizes last: with dynamic shapes this comparison is a guard, which the calls that fail
        # the checks above (fp32, biases, ...) need not carry.
        score_bytes = call.b * call.h * call.sq * call.skv * qh.element_size()
        if score_bytes < self.core_min_score_bytes:
            return None
        limit = self.score_chunk_bytes
        plan = None
        if limit is not None:
            itemsize = qh.element_size()
            plan = _attention_core.chunk_bounds(call.b, call.h, call.sq, call.skv, itemsize, limit)
        return plan or (0, [(0, call.b)])

    @staticmethod
    def _softmax_kind(call, kernel_causal, masked):
        """The te_fast softmax for a vanilla row (one of SOFTMAX_KINDS): a causal kernel
        (no mask tensor) where kernel_causal, else the plain or the explicitly masked softmax."""
        if kernel_causal and not call.bottom_right:
            return "scaled_upper_triang_masked_softmax"
        if kernel_causal:
            return "scaled_aligned_causal_masked_softmax"
        return "scaled_softmax" if masked is None else "scaled_masked_softmax"

    @staticmethod
    def _band(call, device):
        """(j - i - diagonal) as (b|1, 1, sq, skv): the distance from each element's diagonal."""
        i = torch.arange(call.sq, device=device).view(1, 1, call.sq, 1)
        j = torch.arange(call.skv, device=device).view(1, 1, 1, call.skv)
        if not call.bottom_right:
            return j - i
        if call.lengths_q is None:
            return j - i - (call.skv - call.sq)
        return j - i - (call.lengths_kv - call.lengths_q).view(-1, 1, 1, 1)

    def _mask(self, call, device):
        """Bool (b|1, h|1, sq, skv), True = masked out; None when nothing can be masked."""
        masked = None
        padding_mask = call.attention_mask if call.attn_mask_type in _PADDING_TYPES else None
        if padding_mask is not None:  # exactly the positions it marks, left padding too
            pad_q, pad_kv = (
                padding_mask if isinstance(padding_mask, (tuple, list)) else (padding_mask,) * 2
            )  # (b, 1, 1, sq), (b, 1, 1, skv)
            masked = pad_q.view(call.b, 1, call.sq, 1) | pad_kv.view(call.b, 1, 1, call.skv)
        elif call.lengths_q is not None:
            i = torch.arange(call.sq, device=device).view(1, 1, call.sq, 1)
            j = torch.arange(call.skv, device=device).view(1, 1, 1, call.skv)
            masked = (i >= call.lengths_q.view(-1, 1, 1, 1)) | (
                j >= call.lengths_kv.view(-1, 1, 1, 1)
            )
        left, right = call.window
        if left >= 0 or right >= 0:
            rel = self._band(call, device)
            band = torch.zeros_like(rel, dtype=torch.bool)
            if right >= 0:
                band = band | (rel > right)
            if left >= 0:
                band = band | (rel < -left)
            masked = band if masked is None else masked | band
        if call.attn_mask_type == "arbitrary":
            mask = call.attention_mask
            masked = mask if masked is None else masked | mask
        return masked

    def _alibi(self, call, device):
        """-slope_h * |i - j + off| as fp32 (b|1, h, sq, skv)."""
        slopes = call.alibi_slopes
        if slopes is None:
            slopes = _alibi_slopes(call.h, device)
        slopes = slopes.float().reshape(-1, call.h, 1, 1)  # (b|1, h, 1, 1)
        distance = self._band(call, device).abs().float()  # (b|1, 1, sq, skv)
        return -slopes * distance

    @staticmethod
    def _masked_softmax(scores, masked, scale):
        return _attention_core.scores_softmax("scaled_masked_softmax", scores, masked, scale)

    def _sink_softmax(self, call, scores, scale, masked):
        """off-by-one / learnable: one extra logit (0 or offset[h]) joins every row's denominator.

        The scores are scaled in fp32 and the sink column appended, so the te_fast kernel runs on
        [b, h, sq, skv + 1] in fp32; the sink column is never masked and is dropped afterwards.
        """
        b, h, sq, skv = scores.shape
        logits = scores.float() * scale  # (b, h, sq, skv)
        if call.softmax_type == "off-by-one":
            sink = logits.new_zeros(b, h, sq, 1)
        else:
            sink = call.softmax_offset.float().reshape(1, h, 1, 1).expand(b, h, sq, 1)
        ext = torch.cat([logits, sink], dim=-1)  # (b, h, sq, skv + 1)
        if masked is None:
            probs = _eager_softmax.softmax("scaled_softmax_fwd", ext, None, 1.0)
        else:
            m = masked.expand(-1, -1, sq, skv)
            keep_sink = torch.zeros(m.shape[:-1] + (1,), dtype=torch.bool, device=m.device)
            probs = self._masked_softmax(ext, torch.cat([m, keep_sink], dim=-1), 1.0)
        return probs[..., :skv].to(scores.dtype)  # (b, h, sq, skv)

    @staticmethod
    def _output(call, o):
        b, h, sq, dv = o.shape
        if call.q_format == "sbhd":
            return o.permute(2, 0, 1, 3).reshape(sq, b, h * dv)  # (sq, b, h*dv)
        if call.q_format == "bshd":
            return o.permute(0, 2, 1, 3).reshape(b, sq, h * dv)  # (b, sq, h*dv)
        t = call.num_tokens_q
        thd = ops.convert_bshd_to_thd(o.permute(0, 2, 1, 3), call.cu_seqlens_q, t)  # (t, h, dv)
        return thd.view(t, h * dv)


@torch._dynamo.disable
def _fp8_island(module, call, q, k, v, fp8_enabled, fp8_meta, fp8_output):
    """FP8 runs eagerly: under torch.compile this call is one graph break (fullgraph=True gives
    dynamo's error about a disabled function) and never a wrong compiled result."""
    return module._fp8_forward(call, q, k, v, fp8_enabled, fp8_meta, fp8_output)
