"""FP8 emulation reference (SPEC §5): quantize/dequantize, TE 2.20.2's scaling recipes with a
scaling state of its own, and attention with fake-quantization at the six points FP8 attention
holds FP8 data. Plain PyTorch, readable; it takes no scale from the implementation it judges.

The recipes and their update rule follow Transformer Engine 2.20.2 (paths under
transformer_engine/):
- ``DelayedScaling`` (common/recipe/__init__.py:173-284): a role's amax is collected in slot 0
  of its history while it is quantized; after the pass the fused update (common/recipe/
  delayed_scaling.cu, kernel_bulk, 163-253) takes ``amax_h`` = the history max ("max", NaN
  entries ignored by fmaxf) or slot 0 ("most_recent"), rolls the history (slot i takes slot
  i + 1, the last slot takes slot 0, slot 0 is zeroed) and sets ``scale = scaled_max / amax_h``
  with ``scaled_max = fp8_max * 2**-margin`` (331), one fp32 division. An ``amax_h`` that is 0 or
  not finite keeps the scale, an infinite scale becomes FLT_MAX (226-250), and a pass whose amax
  is 0 changes nothing: the roll is skipped (186). (TE's unfused Python update,
  pytorch/quantization.py:1067-1170, rolls such a pass in and computes ``fp8_max * (1/amax)``;
  SPEC §7 makes the fused kernel the standard.)
- ``CurrentScaling`` (TE's ``Float8CurrentScaling``, common/recipe/__init__.py:286-335): the
  scale of a tensor is ``fp8_max / amax`` of that tensor (``__fdiv_rn``, one fp32 division), 1
  for an amax of 0, inf or NaN, FLT_MAX where the division overflows
  (common/recipe/recipe_common.cuh:14-49).
- S and dP are produced inside the attention kernel, so they are always delayed: under
  ``Float8CurrentScaling`` TE's DotProductAttention builds ``DelayedScaling(fp8_format,
  amax_history_len=1, amax_compute_algo="most_recent")`` for them
  (pytorch/attention/dot_product_attention/dot_product_attention.py:406-407, 1161, 1207-1223).
- A role's amax is that of its tensor in the nominal (input) dtype, as TE's kernels see it:
  te_ref takes it from its same-precision lane, whose softmax and softmax backward round once
  to the input dtype, as TE's softmax kernels do (see FP8Pass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from te_ref.attention import build_mask
from te_ref.config import resolve
from te_ref.ops import convert_bshd_to_thd, convert_thd_to_bshd, masked_softmax

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
FLT_MAX = torch.finfo(torch.float32).max
FORWARD_ROLES = ("QKV", "S", "O")
BACKWARD_ROLES = ("dO", "dP", "dQKV")
ROLES = FORWARD_ROLES + BACKWARD_ROLES
ALWAYS_DELAYED = ("S", "dP")
# fp8_format -> (forward dtype, backward dtype); HYBRID: E4M3 forward, E5M2 backward
FORMATS = {
    "E4M3": (torch.float8_e4m3fn, torch.float8_e4m3fn),
    "E5M2": (torch.float8_e5m2, torch.float8_e5m2),
    "HYBRID": (torch.float8_e4m3fn, torch.float8_e5m2),
}


@dataclass(frozen=True)
class DelayedScaling:
    """TE's DelayedScaling, the fields FP8 attention uses (TE's defaults)."""

    margin: int = 0
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"  # "max" | "most_recent"

    def __post_init__(self):
        if self.fp8_format not in FORMATS:
            raise ValueError(
                f"fp8_format must be one of {sorted(FORMATS)}, got {self.fp8_format!r}"
            )
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got "
                             f"{self.amax_compute_algo!r}")  # fmt: skip
        if self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len}")


@dataclass(frozen=True)
class CurrentScaling:
    """TE's Float8CurrentScaling (per-tensor current scaling)."""

    fp8_format: str = "HYBRID"

    def __post_init__(self):
        if self.fp8_format not in FORMATS:
            raise ValueError(
                f"fp8_format must be one of {sorted(FORMATS)}, got {self.fp8_format!r}"
            )


def role_recipe(recipe, role: str):
    """The recipe a role is scaled by: S and dP are delayed under every recipe (TE's DPA builds a
    one-entry, most_recent DelayedScaling for them under Float8CurrentScaling)."""
    if isinstance(recipe, CurrentScaling) and role in ALWAYS_DELAYED:
        return DelayedScaling(fp8_format=recipe.fp8_format, amax_history_len=1,
                              amax_compute_algo="most_recent")  # fmt: skip
    if not isinstance(recipe, (DelayedScaling, CurrentScaling)):
        raise ValueError(f"recipe must be te_ref.fp8.DelayedScaling or CurrentScaling, got "
                         f"{type(recipe).__name__}")  # fmt: skip
    return recipe


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
    """Current scaling (TE's compute_scale_from_amax): fp8_max / amax in fp32; 1 when amax is 0,
    inf or NaN; FLT_MAX where the division overflows."""
    amax = amax.float()
    if not (torch.isfinite(amax) and amax > 0):
        return torch.ones((), device=amax.device)
    scale = torch.tensor(FP8_MAX[fp8_dtype], device=amax.device) / amax
    return torch.full_like(scale, FLT_MAX) if torch.isinf(scale) else scale


class RoleScaling:
    """One role's scaling state, kept the way TE keeps it: ``amax_history`` (fp32, TE's layout:
    slot 0 collects this pass's amax, the update moves it to the end) and ``scale`` (fp32, the
    scale the next pass quantizes with). Starts at history zeros and scale 1 (TE's init)."""

    def __init__(self, role: str, recipe, device="cpu"):
        recipe = role_recipe(recipe, role)
        self.role = role
        self.fp8_dtype = FORMATS[recipe.fp8_format][role in BACKWARD_ROLES]
        self.fmax = FP8_MAX[self.fp8_dtype]
        self.delayed = isinstance(recipe, DelayedScaling)
        self.margin = recipe.margin if self.delayed else 0
        self.algo = recipe.amax_compute_algo if self.delayed else None
        length = recipe.amax_history_len if self.delayed else 1
        self.amax_history = torch.zeros(length, device=device)
        self.scale = torch.ones((), device=device)
        # the amax the current scale was computed from (None: the initial scale 1, or, under
        # current scaling, an amax of 0/inf/NaN)
        self.scale_amax: torch.Tensor | None = None

    @property
    def scaled_max(self) -> float:
        """fp8_max * 2**-margin (fp32 in TE; exact, a power-of-two multiple)."""
        return self.fmax * 2.0**-self.margin

    def scale_for(self, amax: torch.Tensor) -> torch.Tensor:
        """The scale this pass quantizes with: the delayed scale, or this tensor's own."""
        if self.delayed:
            return self.scale
        scale = current_scale(amax, self.fp8_dtype)
        self.scale = scale
        self.scale_amax = amax.float() if (torch.isfinite(amax) and amax > 0) else None
        return scale

    def record(self, amax: torch.Tensor) -> None:
        """The quantization kernel's amax reduction into slot 0 (delayed roles only)."""
        if self.delayed:
            self.amax_history[0] = torch.maximum(self.amax_history[0], amax.float())

    def update(self) -> None:
        """TE's fused amax-and-scale update (delayed_scaling.cu kernel_bulk) after a pass."""
        if not self.delayed:
            return
        history = self.amax_history
        last = history[0].clone()
        if last == 0:  # "if (last_amax != 0.0f)" guards the roll; amax stays 0: keep the scale
            return
        if self.algo == "max":  # fmaxf over the window: NaN entries are ignored
            amax = torch.where(torch.isnan(history), 0.0, history).max()
        else:
            amax = last
        rolled = torch.cat([history[1:], history[:1]])  # slot i <- slot i+1, the end <- slot 0
        rolled[0] = 0.0
        self.amax_history = rolled
        if torch.isfinite(amax) and amax > 0:
            scale = torch.tensor(self.scaled_max, device=amax.device) / amax
            self.scale = torch.full_like(scale, FLT_MAX) if torch.isinf(scale) else scale
            self.scale_amax = amax


class FP8State:
    """The scaling state of one attention module, by role; starts as TE's does (zeros, 1)."""

    def __init__(self, recipe, device="cpu"):
        self.recipe = recipe
        self.roles = {role: RoleScaling(role, recipe, device) for role in ROLES}

    def __getitem__(self, role: str) -> RoleScaling:
        return self.roles[role]


@dataclass
class RoleStep:
    """What one role did in one pass: its amax (fp32, of the same-precision tensors, as TE's),
    the scale it quantized with and the amax behind that scale, the state after the pass, and
    the tensors it quantized (before quantization) in both lanes, for error bounds."""

    amax: torch.Tensor
    scale_used: torch.Tensor
    scale_used_amax: torch.Tensor | None
    scale: torch.Tensor
    scale_amax: torch.Tensor | None
    amax_history: torch.Tensor
    tensors: list[torch.Tensor]  # same precision
    tensors64: list[torch.Tensor]  # float64


@dataclass
class FP8Pass:
    """One pass of FP8-emulated attention in two lanes that quantize alike: float64 between the
    quantization points (the golden answer) and the input dtype (the same-precision composite of
    SPEC 6, whose tensors give the amaxes, as TE's are of its nominal-dtype tensors)."""

    out: torch.Tensor  # float64
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # float64 (dq, dk, dv)
    out_lp: torch.Tensor
    grads_lp: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    steps: dict[str, RoleStep]


def _repeat(t, h):
    return t.repeat_interleave(h // t.shape[1], dim=1)  # (b, hg, s, d) -> (b, h, s, d)


def _group_sum(t, hg):
    b, h, s, d = t.shape
    return t.reshape(b, hg, h // hg, s, d).sum(dim=2)  # (b, h, s, d) -> (b, hg, s, d)


def fp8_dot_product_attention(
    q, k, v, grad_out, *, qkv_layout, softmax_scale, fp8_state: FP8State, **kwargs
) -> FP8Pass:
    """One pass (forward, and backward when grad_out is given) of FP8-emulated attention,
    scaled by and updating ``fp8_state``: this reference's own, fed by nothing but its own
    amaxes. As in TE, the delayed scales of the forward roles are updated after the forward and
    those of the backward roles after the backward; a role's amax is that of its tensors in the
    input dtype (TE's are of the nominal-dtype tensors). The float64 lane quantizes with the
    same scales (see FP8Pass)."""
    call = resolve(q, k, v, qkv_layout=qkv_layout, softmax_scale=softmax_scale, **kwargs)
    unsupported = [name for name, value, plain in (
        ("core_attention_bias_type", call.bias_type, "no_bias"),
        ("softmax_type", call.softmax_type, "vanilla"),
    ) if value != plain]  # fmt: skip
    if unsupported:
        raise NotImplementedError(f"te_ref's FP8 emulation does not support {unsupported}")
    lp_dtype = q.dtype
    used: dict[str, tuple] = {}

    def scale_lp(role, tensors):  # the state's scale for this pass (and the amax seen)
        state = fp8_state[role]
        amax = torch.stack([t.abs().max().float() for t in tensors]).max()
        scale = state.scale_for(amax)
        used[role] = (amax, scale.clone(), state.scale_amax, list(tensors))
        state.record(amax)
        return scale, state.fp8_dtype

    lanes = {"lp": _emulate(q, k, v, grad_out, call, lp_dtype, scale_lp)}
    quantized64: dict[str, list[torch.Tensor]] = {}

    def scale_64(role, tensors):  # the float64 lane quantizes alike
        quantized64[role] = list(tensors)
        return used[role][1], fp8_state[role].fp8_dtype

    lanes["64"] = _emulate(q, k, v, grad_out, call, torch.float64, scale_64)
    updated_roles = FORWARD_ROLES + (BACKWARD_ROLES if grad_out is not None else ())
    steps = {}
    for role in updated_roles:
        state = fp8_state[role]
        state.update()
        amax, scale, scale_amax, tensors = used[role]
        steps[role] = RoleStep(amax, scale, scale_amax, state.scale.clone(), state.scale_amax,
                               state.amax_history.clone(), tensors, quantized64[role])  # fmt: skip
    (out, grads), (out_lp, grads_lp) = lanes["64"], lanes["lp"]
    return FP8Pass(out, grads, out_lp, grads_lp, steps)


def _emulate(q, k, v, grad_out, call, cd, scale_of):
    """Forward (and backward) with fake quantization at Q, K, V (one scale), S = softmax
    output, O; dO, dP (the gradient of the pre-softmax scores), dQ, dK, dV (one scale), the
    scales from ``scale_of(role, tensors) -> (scale, fp8 dtype)``; everything between the
    quantization points in ``cd``. Returns (out, (dq, dk, dv) or None) in the input layouts."""
    dev = q.device
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

    def fq(role, *tensors):  # fake-quantize tensors that share one scale
        scale, fp8_dtype = scale_of(role, tensors)
        return [fake_quant(t, scale, fp8_dtype) for t in tensors]

    qh = heads_first(q.to(cd), q_format, cu_q, sq)  # (b, h, sq, d)
    kh = heads_first(k.to(cd), kv_format, cu_kv, skv)  # (b, hg, skv, d)
    vh = heads_first(v.to(cd), kv_format, cu_kv, skv)  # (b, hg, skv, dv)
    masked = build_mask(call, dev)  # (b, h|1, sq, skv)

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
    if grad_out is None:
        return out, None

    # ---- backward, written out (dO -> dV, dP -> dQ, dK)
    do = heads_first(grad_out.to(cd).reshape(*grad_out.shape[:-1], h, call.dv),
                     q_format, cu_q, sq)  # fmt: skip
    (do8,) = fq("dO", do)
    dv = _group_sum(torch.matmul(p8.transpose(-2, -1), do8), call.hg)  # (b, hg, skv, dv)
    dp_soft = torch.matmul(do8, vr.transpose(-2, -1))  # (b, h, sq, skv)
    # softmax backward; in fp32 at least, rounded once to cd (as TE's softmax backward kernel:
    # the amax of dP is that of a once-rounded tensor)
    acc = torch.promote_types(cd, torch.float32)
    p_acc, dp_acc = p.to(acc), dp_soft.to(acc)
    ds = (call.scale * p_acc * (dp_acc - (dp_acc * p_acc).sum(-1, keepdim=True))).to(cd)
    (ds8,) = fq("dP", ds)
    dq = torch.matmul(ds8, kr)  # (b, h, sq, d)
    dk = _group_sum(torch.matmul(ds8.transpose(-2, -1), q8), call.hg)  # (b, hg, skv, d)
    dq8, dk8, dv8 = fq("dQKV", dq, dk, dv)
    grads = (
        back_to_layout(dq8, q_format, cu_q, q),
        back_to_layout(dk8, kv_format, cu_kv, k),
        back_to_layout(dv8, kv_format, cu_kv, v),
    )
    return out, grads
