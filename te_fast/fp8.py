"""FP8 emulation for UnfusedDotProductAttention: formats, scaling recipes, per-role scaling
state, the Float8Tensor output type, and the fake-quantized attention itself (eager only)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map

from te_fast import ops

__all__ = ["CurrentScaling", "DelayedScaling", "Float8Tensor", "Format", "ScalingStateView"]

FORWARD_ROLES = ("QKV", "S", "O")
BACKWARD_ROLES = ("dO", "dP", "dQKV")
ROLES = FORWARD_ROLES + BACKWARD_ROLES
# S and dP are produced inside the attention kernel: their amax cannot be known before they are
# quantized, so they use delayed scaling under every recipe.
ALWAYS_DELAYED = ("S", "dP")
_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_FLT_MAX = torch.finfo(torch.float32).max


class Format(enum.Enum):
    """FP8 formats: E4M3 (max 448), E5M2 (max 57344), HYBRID (E4M3 forward, E5M2 backward)."""

    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"

    def dtype(self, role: str) -> torch.dtype:
        if self is Format.E5M2 or (self is Format.HYBRID and role in BACKWARD_ROLES):
            return torch.float8_e5m2
        return torch.float8_e4m3fn


@dataclass(frozen=True)
class DelayedScaling:
    """Scales from an amax history of previous steps: scale = max / amax / 2**margin."""

    fp8_format: Format = Format.HYBRID
    margin: int = 0
    amax_history_len: int = 1024  # TE 2.20.2 common/recipe/__init__.py:255
    amax_compute_algo: str = "max"  # "max" | "most_recent"

    def __post_init__(self):
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got "
                             f"{self.amax_compute_algo!r}")  # fmt: skip
        if self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {self.amax_history_len}")


@dataclass(frozen=True)
class CurrentScaling:
    """Scale from each tensor's own amax (max / amax); S and dP still use delayed scaling, with a
    one-step history (the previous step's amax)."""

    fp8_format: Format = Format.HYBRID


@dataclass(frozen=True)
class ScalingStateView:
    """A read-only copy of one role's scaling state."""

    scale: torch.Tensor  # used by the next step (delayed) / by the last step (current)
    scale_inv: torch.Tensor
    amax_history: torch.Tensor  # newest first
    last_scale: torch.Tensor  # the scale the last step quantized with


class _RoleState:
    """Mutable scaling state of one role (owned by the module, updated in the eager island)."""

    def __init__(self, role: str, recipe, device):
        self.role = role
        self.fp8_dtype = recipe.fp8_format.dtype(role)
        self.fmax = _MAX[self.fp8_dtype]
        delayed = isinstance(recipe, DelayedScaling)
        self.current = not delayed and role not in ALWAYS_DELAYED
        self.margin = recipe.margin if delayed else 0
        self.algo = recipe.amax_compute_algo if delayed else "most_recent"
        length = recipe.amax_history_len if delayed else 1
        self.amax_history = torch.zeros(length, device=device)
        self.scale = torch.ones((), device=device)
        self.last_scale = torch.ones((), device=device)

    def view(self) -> ScalingStateView:
        return ScalingStateView(
            self.scale.clone(), 1.0 / self.scale, self.amax_history.clone(), self.last_scale.clone()
        )

    def _scale_from(self, amax, fallback):
        """TE's kernels: (max * 2**-margin) / amax as one fp32 division (not max * (1/amax));
        ``fallback`` where amax is 0 or not finite; FLT_MAX where the division overflows."""
        scale = torch.full_like(amax, self.fmax * 2.0**-self.margin) / amax
        scale = torch.where(torch.isinf(scale), torch.full_like(scale, _FLT_MAX), scale)
        return torch.where(torch.isfinite(amax) & (amax > 0), scale, fallback)

    def fake_quant(self, tensors, keep_data: bool = False):
        """Quantize-dequantize tensors sharing this role's scale; then update the state."""
        amax = torch.stack([t.detach().abs().amax().float() for t in tensors]).amax()
        if self.current:
            scale = self._scale_from(amax, torch.ones_like(amax))
        else:
            scale = self.scale  # from the history before this step's amax is recorded
        scale_inv = 1.0 / scale
        datas = [
            (t.float() * scale).clamp(-self.fmax, self.fmax).to(self.fp8_dtype) for t in tensors
        ]
        outs = [(d.float() * scale_inv).to(t.dtype) for d, t in zip(datas, tensors)]
        self.last_scale = scale.detach().clone()
        if self.current:
            self.scale = self.last_scale
        # the history rolls after use: newest first, the oldest falls out; a step whose amax is
        # 0 leaves history and scale as they were (TE's fused update skips it)
        history = torch.cat([amax.reshape(1), self.amax_history[:-1]])
        recorded = amax != 0
        self.amax_history = torch.where(recorded, history, self.amax_history)
        if not self.current:  # NaN entries do not count for "max" (TE's fmaxf)
            window = torch.where(torch.isnan(self.amax_history), 0.0, self.amax_history)
            amax_h = window.max() if self.algo == "max" else self.amax_history[0]
            new = self._scale_from(amax_h, self.scale)
            self.scale = torch.where(recorded, new, self.scale)
        if keep_data:
            return outs, datas, scale_inv
        return outs


def make_state(recipe, device) -> dict[str, _RoleState]:
    if not isinstance(recipe, (DelayedScaling, CurrentScaling)):
        raise ValueError(
            "fp8_meta['recipe'] must be te_fast.fp8.DelayedScaling or CurrentScaling, got "
            f"{type(recipe).__name__}"
        )
    return {role: _RoleState(role, recipe, device) for role in ROLES}


# ----------------------------------------------------------------------------- Float8Tensor

_PASSTHROUGH = (torch.ops.aten.detach.default, torch.ops.aten.alias.default,
                torch.ops.aten.clone.default)  # fmt: skip


class Float8Tensor(torch.Tensor):
    """FP8 data with its scale_inv, reporting the shape and dtype of the nominal tensor.

    ``dequantize()`` gives the nominal tensor; any op without a rule here runs on the
    dequantized value (detach/alias/clone keep the FP8 form).
    """

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                requires_grad: bool = False):  # fmt: skip
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, dtype=dtype, device=data.device, requires_grad=requires_grad
        )

    def __init__(self, data, scale_inv, dtype, requires_grad=False):
        if data.dtype not in _MAX:
            raise ValueError(f"Float8Tensor data must be float8_e4m3fn/e5m2, got {data.dtype}")
        self._data = data
        self._scale_inv = scale_inv

    @property
    def fp8_dtype(self) -> torch.dtype:
        return self._data.dtype

    @property
    def scale_inv(self) -> torch.Tensor:
        return self._scale_inv

    def dequantize(self) -> torch.Tensor:
        return (self._data.float() * self._scale_inv).to(self.dtype)

    def __repr__(self):
        return (f"Float8Tensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"fp8_dtype={self.fp8_dtype}, scale_inv={self._scale_inv.item():.6g})")  # fmt: skip

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _PASSTHROUGH and isinstance(args[0], Float8Tensor):
            src = args[0]
            if func is torch.ops.aten.clone.default:  # a tensor of its own: data and scale
                return Float8Tensor(src._data.clone(), src._scale_inv.clone(), src.dtype)
            return Float8Tensor(src._data, src._scale_inv, src.dtype)

        def unwrap(t):
            return t.dequantize() if isinstance(t, Float8Tensor) else t

        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))


class _ToFloat8(torch.autograd.Function):
    """Wraps the (already quantized) output as a Float8Tensor; gradients pass straight through."""

    @staticmethod
    def forward(ctx, dequantized, data, scale_inv):
        return Float8Tensor(data, scale_inv, dequantized.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def to_float8(dequantized: torch.Tensor, data: torch.Tensor, scale_inv: torch.Tensor):
    return _ToFloat8.apply(dequantized, data, scale_inv)


# ----------------------------------------------------------------------------- attention core


def _repeat(t, h):
    b, hg, s, d = t.shape
    return t if hg == h else t[:, :, None].expand(b, hg, h // hg, s, d).reshape(b, h, s, d)


def _group_sum(t, hg):
    b, h, s, d = t.shape
    return t if hg == h else t.reshape(b, hg, h // hg, s, d).sum(dim=2)


class FP8Attention(torch.autograd.Function):
    """(b, h, sq, d) q and (b, hg, skv, d) k/v -> (b, h, sq, dv) with fake quantization at
    Q/K/V, S, O (forward) and dO, dP, dQ/dK/dV (backward). Returns (out, O's fp8 data,
    O's scale_inv); only the first output is differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, masked, softmax_scale, state, softmax_fn):
        h, hg = q.shape[1], k.shape[1]
        q8, k8, v8 = state["QKV"].fake_quant([q, k, v])
        kr, vr = _repeat(k8, h), _repeat(v8, h)
        scores = torch.matmul(q8, kr.transpose(-2, -1))  # (b, h, sq, skv)
        p = softmax_fn(scores, masked, softmax_scale)  # te_fast softmax kernels
        (p8,) = state["S"].fake_quant([p])
        o = torch.matmul(p8, vr)  # (b, h, sq, dv)
        (o8,), (o_data,), o_scale_inv = state["O"].fake_quant([o], keep_data=True)
        ctx.save_for_backward(q8, kr, vr, p, p8)
        ctx.softmax_scale, ctx.state, ctx.hg = softmax_scale, state, hg
        ctx.mark_non_differentiable(o_data, o_scale_inv)
        return o8, o_data, o_scale_inv

    @staticmethod
    def backward(ctx, do, _data_grad, _scale_grad):
        q8, kr, vr, p, p8 = ctx.saved_tensors
        state = ctx.state
        (do8,) = state["dO"].fake_quant([do])
        dv = _group_sum(torch.matmul(p8.transpose(-2, -1), do8), ctx.hg)  # (b, hg, skv, dv)
        dp_soft = torch.matmul(do8, vr.transpose(-2, -1))  # (b, h, sq, skv)
        ds = ops.scaled_softmax_bwd(dp_soft, p, ctx.softmax_scale)  # grad of the scores
        (ds8,) = state["dP"].fake_quant([ds])
        dq = torch.matmul(ds8, kr)  # (b, h, sq, d)
        dk = _group_sum(torch.matmul(ds8.transpose(-2, -1), q8), ctx.hg)  # (b, hg, skv, d)
        dq8, dk8, dv8 = state["dQKV"].fake_quant([dq, dk, dv])
        return dq8, dk8, dv8, None, None, None, None
