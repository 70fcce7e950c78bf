"""FP8 emulation (SPEC §5): an implementation against te_ref's emulation run on its own (te_ref
keeps its own scaling state, TE 2.20.2's recipes, over the same sequence of calls), the scaling
state against literal values typed from TE's formulas, grouped heads, formats, saturation,
Float8Tensor, and the eager island under torch.compile.

Through every selected adapter that declares ``supports_fp8`` (docs/adapters.md): the end-to-end
emulation and grouped-head cases, the RMSE bound against the same call without FP8, and, for
adapters that also declare the ``fp8_state`` capability (``read_fp8_state``), the scaling state:
each role's amax and scales every pass, the three literal passes and the HYBRID grids. An adapter
without ``fp8_state`` is judged on its outputs and gradients alone. The suites hand an adapter
te_ref.fp8's recipes (TE's field names); ``Adapter.fp8_recipe`` makes the implementation's own.

te_fast alone: its scaling state's edges and quantizer (te_fast.fp8's state object, fed tensors
directly), its Float8Tensor output, its eager island under torch.compile and its FP8 argument
errors: these are te_fast's API, not the adapter contract."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch._dynamo.utils import counters

import te_ref.fp8 as ref8
from reports import record
from suites import devices
from suites.adapters import ready
from suites.adapters.base import FP8_ROLES as ROLES
from suites.adapters.base import Adapter
from suites.cases import AttnCase, make_inputs, sized
from suites.checks import contracts
from suites.checks.numerics import K_BACKWARD, K_FORWARD, check_ratio, floor
from te_fast.fp8 import CurrentScaling, DelayedScaling, Float8Tensor, Format, make_state

FP8_LAYOUTS = ("sbh3d", "bshd_bshd_bshd", "sbhd_sbhd_sbhd", "thd_thd_thd")
# the suites' recipes are te_ref's (TE's field names); an adapter translates (fp8_recipe)
RECIPES = {
    "delayed": ref8.DelayedScaling(amax_history_len=4),
    "current": ref8.CurrentScaling(),
}
FORWARD_ROLES = ("QKV", "S", "O")
# scale = max / amax is one fp32 division (TE's too): the amax a scale implies is off by at most
# an fp32 rounding (2**-24 relative); twice that, with room
FP32_DIVISION = 2.0**-22
FLT_MAX = torch.finfo(torch.float32).max
DEVICES = devices.device_params()


def _record(name, device_name, **fields):
    """A case of te_fast's own FP8 API (the tests that do not go through an adapter)."""
    record.case(impl="te_fast.fp8", layout=fields.pop("layout", f"fp8:{name}"),
                device=device_name, **fields)  # fmt: skip


def _ready(adapter: Adapter, case: AttnCase, name: str, *capabilities: str, **fields):
    """Record an adapter's FP8 case; its device, or a skip with the reason where the adapter
    declares no FP8 (``supports_fp8``), lacks a capability or cannot run the case."""
    record.case(impl=f"{adapter.name}.fp8", layout=fields.pop("layout", f"fp8:{name}"),
                device=case.device, **fields)  # fmt: skip
    if adapter.lacks_fp8():
        pytest.skip(adapter.lacks_fp8())
    return ready(adapter, case, *capabilities)


def _module(adapter: Adapter, case: AttnCase, softmax_scale: float | None = None):
    scale = case.d**-0.5 if softmax_scale is None else softmax_scale
    return adapter.build(case, scale)


def _te_fast_module(case: AttnCase):
    """te_fast's module, for the tests of its own FP8 API."""
    from te_fast import UnfusedDotProductAttention

    return UnfusedDotProductAttention(case.d**-0.5, attention_type=case.attention_type)


def _step(adapter, module, case, inputs, recipe, fp8=True):
    """One forward and backward through the adapter; returns (out, {leaf: grad})."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.leaves.items()}
    q, k, v, _ = inputs.views(leaves, case)
    kwargs = dict(inputs.kwargs)
    if fp8:
        kwargs.update(fp8=True, fp8_meta={"recipe": adapter.fp8_recipe(recipe)})
    out = adapter.call(module, case, q, k, v, kwargs)[0]
    grads = torch.autograd.grad(out, list(leaves.values()), inputs.grad_out)
    return out.detach(), dict(zip(leaves, grads))


def _case(layout, dtype, device_name, gqa=1):
    mask = "padding_causal" if layout.startswith("thd") else "causal"
    return sized(AttnCase(layout, dtype, mask, device=device_name), gqa=gqa)


# ----------------------------------------------------------------------------- end to end


def _check_amax(name, got, want, bound):
    """The implementation's amax of a role against te_ref's own, within ``bound``: the SPEC 6
    bound of the tensors it is the amax of (|max|x| - max|y|| <= max|x - y|: a tensor that passes
    the rule has its amax within the bound)."""
    err = abs(float(got) - float(want))
    record.tensor(name, err, bound, err / bound, metric="fp8_amax")
    assert err <= bound, (
        f"{name}: the amax {float(got)!r} vs te_ref's own {float(want)!r}: |diff| "
        f"{err:.3e} > bound {bound:.3e} (the SPEC 6 bound of the quantized tensors)"
    )


def _check_scale(name, got, want, want_amax, scaled_max, bound, exact):
    """The implementation's scale against te_ref's own. Where te_ref's scale has no amax behind
    it (the initial 1) or every amax so far was the same in both (``exact``), the scales must be
    equal; else the amax the scale implies (scaled_max / scale) must be within ``bound`` (the
    largest amax bound of the passes the scale can come from) of the amax te_ref's scale came
    from, plus the fp32 rounding of the division."""
    got = float(got)
    if want_amax is None or exact:
        err = abs(got - float(want))
        record.tensor(name, err, 0.0, 0.0 if err == 0 else float("inf"), metric="fp8_scale")
        assert err == 0, f"{name}: the scale {got!r} vs te_ref's own {float(want)!r}"
        return
    implied = scaled_max / got
    tol = bound + FP32_DIVISION * float(want_amax)
    err = abs(implied - float(want_amax))
    record.tensor(name, err, tol, err / tol, metric="fp8_scale")
    assert err <= tol, (
        f"{name}: the scale {got!r} (implies amax {implied!r}) vs te_ref's own "
        f"{float(want)!r} (from amax {float(want_amax)!r}): |diff| {err:.3e} > {tol:.3e}"
    )


def _fp8_values(fp8_dtype) -> int:
    """How many distinct finite values ``fp8_dtype`` has (+0 and -0 one value)."""
    codes = torch.arange(256, dtype=torch.uint8).view(fp8_dtype).float()
    return torch.unique(codes[torch.isfinite(codes)]).numel()


def _check_on_fp8_grid(name, tensors, fp8_dtype):
    """SPEC §5: a role's tensors are FP8 data dequantized under one scale, so together they take
    at most as many distinct values as the format has finite values, whatever the scale. An
    implementation that leaves the role unquantized gives thousands. (The error-ratio rule alone
    cannot tell: te_ref's two lanes may round one element to neighbouring FP8 values, and then its
    bound is an FP8 step wide, wider than the error of not quantizing at all.)"""
    limit = _fp8_values(fp8_dtype)
    values = torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors])
    distinct = torch.unique(values).numel()
    record.tensor(name, distinct, limit, distinct / limit, metric="fp8_grid")
    assert distinct <= limit, (
        f"{name}: {distinct} distinct values, more than the {limit} finite values of "
        f"{fp8_dtype} under one scale: the role is not quantized"
    )


def _max_diff(xs, ys) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(xs, ys))


def _judge_sequence(adapter, case, device, recipe_name, seed, steps=2):
    """The implementation and te_ref each run ``steps`` passes (fresh values each), each with a
    scaling state of its own. Every pass, where the adapter reads its state (``fp8_state``):
    each role's amax, the scale it quantized with and the next one against te_ref's; the last
    pass: the output and the gradients by the error-ratio rule (te_ref's float64 lane vs its
    same-precision lane, which quantize alike)."""
    recipe = RECIPES[recipe_name]
    rng = torch.Generator().manual_seed(seed)
    base = make_inputs(case, device, rng)
    module = _module(adapter, case)
    state = ref8.FP8State(recipe, device)
    dtype = base.grad_out.dtype
    bounds: dict[str, list[float]] = {r: [] for r in ROLES}
    same_amaxes = dict.fromkeys(ROLES, True)  # every amax so far bit-equal to te_ref's
    for step in range(steps):
        inputs = base.with_fresh_values(rng)
        out, grads = _step(adapter, module, case, inputs, recipe)
        q, k, v, _ = inputs.views(inputs.leaves, case)
        ref = ref8.fp8_dot_product_attention(
            q, k, v, inputs.grad_out, softmax_scale=case.d**-0.5, fp8_state=state, **inputs.kwargs
        )
        if not adapter.fp8_state:
            continue
        fast = adapter.read_fp8_state(module)
        for role in ROLES:
            k_role = K_FORWARD if role in FORWARD_ROLES else K_BACKWARD
            r = ref.steps[role]
            bounds[role].append(k_role * _max_diff(r.tensors, r.tensors64) + floor(dtype))
            where = f"{role}@{step}"
            amax = fast[role].amax_history[0]
            _check_amax(f"amax.{where}", amax, r.amax, bounds[role][-1])
            exact_before = same_amaxes[role]
            same_amaxes[role] &= bool(amax == r.amax)
            scaled_max = state[role].scaled_max
            _check_scale(f"scale_used.{where}", fast[role].scale_used, r.scale_used,
                         r.scale_used_amax, scaled_max, max(bounds[role]),
                         exact_before if state[role].delayed else same_amaxes[role])  # fmt: skip
            _check_scale(f"scale_next.{where}", fast[role].scale, r.scale, r.scale_amax,
                         scaled_max, max(bounds[role]), same_amaxes[role])  # fmt: skip
    dq, dk, dv, _ = inputs.views(grads, case)
    forward_dtype, backward_dtype = ref8.FORMATS[recipe.fp8_format]
    _check_on_fp8_grid("out.fp8_grid", [out], forward_dtype)
    _check_on_fp8_grid("dqkv.fp8_grid", [dq, dk, dv], backward_dtype)
    check_ratio("out", out, ref.out, ref.out_lp, K_FORWARD)
    for name, g, g64, g_lp in zip(("dq", "dk", "dv"), (dq, dk, dv), ref.grads, ref.grads_lp):
        check_ratio(name, g, g64, g_lp, K_BACKWARD)


@pytest.mark.per_adapter(layout=FP8_LAYOUTS, dtype=("bf16", "fp16"), recipe_name=list(RECIPES),
                         device_name=DEVICES)  # fmt: skip
def test_fp8_matches_reference_emulation(adapter, layout, dtype, recipe_name, device_name):
    """FP8 forward and backward against te_ref's emulation run on its own (its own scaling state
    from its own amaxes, TE's recipe rules) over the same two passes: every role's amax and
    scales each pass (adapters with ``fp8_state``), the output and gradients of the last by the
    error-ratio rule."""
    case = _case(layout, dtype, device_name)
    device = _ready(adapter, case, "emulation", layout=layout, dtype=dtype,
                    mask_type=case.mask_type, recipe=recipe_name)  # fmt: skip
    _judge_sequence(adapter, case, device, recipe_name, zlib.crc32(case.id.encode()))


@pytest.mark.per_adapter(
    **{"layout,heads": [("bshd_bshd_bshd", "gqa"), ("sbhd_sbhd_sbhd", "gqa"),
                        ("thd_thd_thd", "gqa"), ("bshd_bshd_bshd", "mqa")]},
    recipe_name=list(RECIPES), device_name=DEVICES,
)  # fmt: skip
def test_fp8_grouped_heads(adapter, layout, heads, recipe_name, device_name):
    """FP8 with grouped heads (h != hg): GQA (two query heads a kv head) on three layouts and MQA
    (one kv head), judged as the end-to-end case is: query head i reads kv head i // (h / hg),
    and a kv head's gradients sum over its query heads."""
    h = sized(AttnCase(layout, "bf16", "causal", device=device_name)).h
    case = _case(layout, "bf16", device_name, gqa=2 if heads == "gqa" else h)
    assert 1 <= case.hg < case.h
    device = _ready(adapter, case, "grouped_heads", layout=layout, dtype="bf16",
                    mask_type=case.mask_type, recipe=recipe_name, heads=heads)  # fmt: skip
    _judge_sequence(adapter, case, device, recipe_name, zlib.crc32(case.id.encode()))


@pytest.mark.per_adapter(layout=FP8_LAYOUTS, recipe_name=list(RECIPES), device_name=DEVICES)
def test_fp8_close_to_f16(adapter, layout, recipe_name, device_name):
    """Transformer Engine's bound: RMSE(fp8 - f16) <= 0.11 x (max - min) of the f16 result."""
    case = _case(layout, "bf16", device_name)
    device = _ready(adapter, case, "rmse_vs_f16", layout=layout, dtype="bf16",
                    recipe=recipe_name)  # fmt: skip
    recipe = RECIPES[recipe_name]
    rng = torch.Generator().manual_seed(11)
    base = make_inputs(case, device, rng)
    module = _module(adapter, case)
    _step(adapter, module, case, base.with_fresh_values(rng), recipe)
    inputs = base.with_fresh_values(rng)
    out8, grads8 = _step(adapter, module, case, inputs, recipe)
    out16, grads16 = _step(adapter, module, case, inputs, recipe, fp8=False)
    forward_dtype, backward_dtype = ref8.FORMATS[recipe.fp8_format]
    _check_on_fp8_grid("out.fp8_grid", [out8], forward_dtype)
    _check_on_fp8_grid("dqkv.fp8_grid", list(grads8.values()), backward_dtype)
    pairs = [("out", out8, out16)] + [(f"d{n}", grads8[n], grads16[n]) for n in grads16]
    for name, a, b in pairs:
        a, b = a.double(), b.double()
        rmse = (a - b).pow(2).mean().sqrt().item()
        bound = 0.11 * (b.max() - b.min()).item()
        record.tensor(name, rmse, bound, rmse / bound, metric="rmse_vs_f16")
        assert rmse <= bound, f"{name}: RMSE {rmse:.4g} > 0.11 x range = {bound:.4g}"


# ----------------------------------------------------------------------------- scaling details

# Three passes (forward and backward) of a one-head, two-token, d = 1 causal call in bf16 with
# softmax_scale 1, whose every amax is known by hand: q = 0, k = (a/2, 0), v = (a, 0) and
# dO = (0, g), with a = 2, 8, 4 and g = 4, 2, 1 over the passes. Then:
#   S = [[1, 0], [1/2, 1/2]]                amax 1 (every quantization of it below is exact)
#   O = (v8, v8 / 2)                        amax v8 (v8, k8: v[0], k[0] after the QKV quantization,
#                                           where a value times the scale saturates at 448)
#   dP = [[0, 0], [d, -d]], d = g * v8 / 4  amax d (d8: d after the dP quantization)
#   dQ = (0, d8 * k8), dK = 0, dV = (g/2, g/2)   amax max(d8 * k8, g/2)
# Each role's tuple: (amax, the scale it quantized with, its scale after the pass) per pass.
# Formats HYBRID: E4M3 (max 448) forward, E5M2 (max 57344) backward.
#
# DelayedScaling(margin=1, amax_history_len=2): scale = max / amax_h / 2, amax_h the larger of
# the last two amaxes ("max") or the last ("most_recent"); the first pass quantizes with 1.
#   QKV: scales 1, 448/2/2 = 112, 448/8/2 = 28 -> v8 = 2, min(8*112, 448)/112 = 4, 4 and
#        k8 = 1, 4*112/112 = 4, 2; after pass 3: max(4, 8) -> 28, most_recent 4 -> 56
#   O:   amax v8 = 2, 4, 4 -> 448/2/2 = 112, then 448/4/2 = 56
#   dO:  amax 4, 2, 1 -> 57344/4/2 = 7168; then max(2, 4) -> 7168 | 2 -> 14336; then
#        max(1, 2) -> 14336 | 1 -> 28672 (every g * scale is on the E5M2 grid: dO8 = g)
#   dP:  d = 4*2/4 = 2, 2*4/4 = 2, 1*4/4 = 1 -> 14336, 14336, then 14336 | 28672
#   dQKV: max(2*1, 2) = 2, max(2*4, 1) = 8, max(1*2, 1/2) = 2 -> 14336, 57344/8/2 = 3584,
#        then max(2, 8) -> 3584 | 2 -> 14336
# CurrentScaling: QKV, O, dO, dQKV scale = max / amax of the tensor itself; S and dP delayed
# with a one-entry most_recent history and no margin.
#   QKV: 448/2, 448/8, 448/4 = 224, 56, 112 -> v8 = a, k8 = a/2 (a * scale = 448 exactly)
#   S:   1, then 448/1 = 448
#   O:   amax v8 = 2, 8, 4
#   dP:  d = 4*2/4 = 2, 2*8/4 = 4, 1*4/4 = 1; pass 2 quantizes 4 with 57344/2 = 28672:
#        4 * 28672 saturates at 57344, d8 = 2; pass 3 scale 57344/4 = 14336
#   dQKV: max(2*1, 2) = 2, max(2*4, 1) = 8, max(1*2, 1/2) = 2
THREE_PASSES = {
    "max": {
        "QKV": ((2, 8, 4), (1, 112, 28), (112, 28, 28)),
        "S": ((1, 1, 1), (1, 224, 224), (224, 224, 224)),
        "O": ((2, 4, 4), (1, 112, 56), (112, 56, 56)),
        "dO": ((4, 2, 1), (1, 7168, 7168), (7168, 7168, 14336)),
        "dP": ((2, 2, 1), (1, 14336, 14336), (14336, 14336, 14336)),
        "dQKV": ((2, 8, 2), (1, 14336, 3584), (14336, 3584, 3584)),
    },
    "most_recent": {
        "QKV": ((2, 8, 4), (1, 112, 28), (112, 28, 56)),
        "S": ((1, 1, 1), (1, 224, 224), (224, 224, 224)),
        "O": ((2, 4, 4), (1, 112, 56), (112, 56, 56)),
        "dO": ((4, 2, 1), (1, 7168, 14336), (7168, 14336, 28672)),
        "dP": ((2, 2, 1), (1, 14336, 14336), (14336, 14336, 28672)),
        "dQKV": ((2, 8, 2), (1, 14336, 3584), (14336, 3584, 14336)),
    },
    "current": {
        "QKV": ((2, 8, 4), (224, 56, 112), (224, 56, 112)),
        "S": ((1, 1, 1), (1, 448, 448), (448, 448, 448)),
        "O": ((2, 8, 4), (224, 56, 112), (224, 56, 112)),
        "dO": ((4, 2, 1), (14336, 28672, 57344), (14336, 28672, 57344)),
        "dP": ((2, 4, 1), (1, 28672, 14336), (28672, 14336, 57344)),
        "dQKV": ((2, 8, 2), (28672, 7168, 28672), (28672, 7168, 28672)),
    },
}
THREE_PASS_RECIPES = {
    "max": ref8.DelayedScaling(margin=1, fp8_format="HYBRID", amax_history_len=2,
                               amax_compute_algo="max"),
    "most_recent": ref8.DelayedScaling(margin=1, fp8_format="HYBRID", amax_history_len=2,
                                       amax_compute_algo="most_recent"),
    "current": ref8.CurrentScaling(fp8_format="HYBRID"),
}  # fmt: skip
THREE_PASS_KWARGS = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")


def _three_pass_case(device_name):
    return AttnCase("bshd_bshd_bshd", "bf16", "causal", device=device_name, b=1, sq=2, skv=2,
                    h=1, hg=1, d=1, dv=1)  # fmt: skip


def _three_pass_inputs(a: float, g: float, device):
    def column(x0, x1):
        return torch.tensor([x0, x1], dtype=torch.bfloat16, device=device)

    q = column(0.0, 0.0).reshape(1, 2, 1, 1)
    k = column(a / 2, 0.0).reshape(1, 2, 1, 1)
    v = column(a, 0.0).reshape(1, 2, 1, 1)
    return q, k, v, column(0.0, g).reshape(1, 2, 1)


THREE_PASS_VALUES = ((2.0, 4.0), (8.0, 2.0), (4.0, 1.0))  # (a, g) of each pass


@pytest.mark.per_adapter(recipe_name=list(THREE_PASSES), device_name=DEVICES)
def test_delayed_scaling_three_steps(adapter, recipe_name, device_name):
    """Every role's amax, the scale each step quantized with, the scale after it and the
    history, over three steps whose amaxes are known by hand: literal values typed from TE's
    formulas (THREE_PASSES), met exactly (adapters with ``fp8_state``). ``current``:
    Float8CurrentScaling, under which S and dP stay delayed."""
    case = _three_pass_case(device_name)
    device = _ready(adapter, case, f"delayed_{recipe_name}", "fp8_state")
    table = THREE_PASSES[recipe_name]
    module = _module(adapter, case, softmax_scale=1.0)
    kwargs = dict(THREE_PASS_KWARGS, fp8=True,
                  fp8_meta={"recipe": adapter.fp8_recipe(THREE_PASS_RECIPES[recipe_name])})
    for step, (a, g) in enumerate(THREE_PASS_VALUES):
        q, k, v, grad_out = _three_pass_inputs(a, g, device)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = adapter.call(module, case, *leaves, dict(kwargs))[0]
        torch.autograd.grad(out, leaves, grad_out)
        state = adapter.read_fp8_state(module)
        for role in ROLES:
            amaxes, used, after = table[role]
            st = state[role]
            where = f"{adapter.name} {role} pass {step + 1}"
            newest_first = [amaxes[step - i] for i in range(step + 1)]
            history = (newest_first + [0.0] * len(st.amax_history))[: len(st.amax_history)]
            assert st.amax_history.tolist() == history, f"{where}: history {st.amax_history}"
            assert st.scale_used.item() == used[step], f"{where}: quantized with {st.scale_used}"
            assert st.scale.item() == after[step], f"{where}: scale after {st.scale}"


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("recipe_name", list(THREE_PASSES))
def test_delayed_scaling_three_steps_te_ref(recipe_name, device_name):
    """te_ref's own scaling state over the three passes: the literal values of THREE_PASSES, and
    TE's history layout."""
    record.case(impl="te_ref.fp8", layout=f"fp8:delayed_{recipe_name}", device=device_name)
    device = devices.require(device_name, needs_te_fast=False)
    table = THREE_PASSES[recipe_name]
    state = ref8.FP8State(THREE_PASS_RECIPES[recipe_name], device)
    for step, (a, g) in enumerate(THREE_PASS_VALUES):
        q, k, v, grad_out = _three_pass_inputs(a, g, device)
        steps = ref8.fp8_dot_product_attention(
            q, k, v, grad_out, softmax_scale=1.0, fp8_state=state, **THREE_PASS_KWARGS
        ).steps
        for role in ROLES:
            amaxes, used, after = table[role]
            r = steps[role]
            where = f"te_ref {role} pass {step + 1}"
            got = (r.amax.item(), r.scale_used.item(), r.scale.item())
            assert got == (amaxes[step], used[step], after[step]), where
            if state[role].delayed:  # TE's layout: slot 0 zeroed, this pass's amax at the end
                history = [0.0] + [amaxes[step]] * (len(r.amax_history) - 1)
                assert r.amax_history.tolist() == history, f"{where}: history {r.amax_history}"


# TE's update rule at its edges, one role (QKV, E4M3), history length 2, margin 0; each pass is
# (the amax, the scale after it, te_fast's history newest first). A delayed pass whose amax is 0
# leaves the state as it was (the fused update skips the roll, delayed_scaling.cu:186); an
# amax_h that is inf keeps the scale; a scale past fp32's range is FLT_MAX (delayed_scaling.cu
# 226-250); current scaling gives 1 for an amax of 0, inf or NaN (recipe_common.cuh:14-49). The
# scale is one fp32 division (the kernels' "scaled_max / amax", recipe_common.cuh's __fdiv_rn).
TINY = 2.0**-130  # an fp32 subnormal: 448 / TINY overflows fp32
INF, NAN = float("inf"), float("nan")
# 448 / 3 = 149.33... = 0x1.2aaaaa|aa...p+7: past fp32's 23 fraction bits come 0101... (below
# half), so the one fp32 division of TE's kernels gives 0x1.2aaaaap+7; 448 * fl32(1/3) would
# give 0x1.2aaaacp+7
SCALE_3 = float.fromhex("0x1.2aaaaap+7")
EDGES = {
    "max": [
        (8.0, 56.0, [8.0, 0.0]), (0.0, 56.0, [8.0, 0.0]), (4.0, 56.0, [4.0, 8.0]),
        (INF, 56.0, [INF, 4.0]), (2.0, 56.0, [2.0, INF]), (1.0, 224.0, [1.0, 2.0]),
        (TINY, 448.0, [TINY, 1.0]), (3.0, SCALE_3, [3.0, TINY]),
    ],
    "most_recent": [
        (8.0, 56.0, [8.0, 0.0]), (0.0, 56.0, [8.0, 0.0]), (4.0, 112.0, [4.0, 8.0]),
        (INF, 112.0, [INF, 4.0]), (2.0, 224.0, [2.0, INF]), (1.0, 448.0, [1.0, 2.0]),
        (TINY, FLT_MAX, [TINY, 1.0]), (3.0, SCALE_3, [3.0, TINY]),
    ],
    "current": [(4.0, 112.0, None), (0.0, 1.0, None), (INF, 1.0, None), (NAN, 1.0, None),
                (TINY, FLT_MAX, None), (2.0, 224.0, None), (3.0, SCALE_3, None)],
}  # fmt: skip


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("algo", list(EDGES))
def test_scaling_edges(algo, device_name):
    """TE's scaling rule where amax is 0, inf, NaN or tiny, and its one fp32 division (EDGES,
    literal), for te_fast's and te_ref's state alike."""
    _record(f"scaling_edges_{algo}", device_name)
    device = devices.require(device_name)
    if algo == "current":
        fast_recipe, ref_recipe = CurrentScaling(Format.E4M3), ref8.CurrentScaling("E4M3")
    else:
        fast_recipe = DelayedScaling(Format.E4M3, amax_history_len=2, amax_compute_algo=algo)
        ref_recipe = ref8.DelayedScaling(fp8_format="E4M3", amax_history_len=2,
                                         amax_compute_algo=algo)  # fmt: skip
    fast = make_state(fast_recipe, device)["QKV"]
    ref = ref8.RoleScaling("QKV", ref_recipe, device)
    for n, (amax, scale, history) in enumerate(EDGES[algo]):
        x = torch.tensor([amax, -amax / 2, 0.0], device=device)
        fast.fake_quant([x])
        ref.scale_for(x.abs().max())
        ref.record(x.abs().max())
        ref.update()
        where = f"pass {n + 1} (amax {amax})"
        assert fast.scale.item() == scale, f"te_fast {where}: scale {fast.scale.item()!r}"
        assert ref.scale.item() == scale, f"te_ref {where}: scale {ref.scale.item()!r}"
        if history is not None:
            assert fast.amax_history.tolist() == history, f"te_fast {where}: {fast.amax_history}"


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("fmt", ("E4M3", "E5M2"))
def test_quantizer_matches_reference_and_saturates(fmt, device_name):
    """The te_fast quantizer equals te_ref's bit for bit; overflow clamps to +-max; zeros keep
    the delayed scale (and give scale 1 under current scaling)."""
    _record(f"quantizer_{fmt}", device_name)
    device = devices.require(device_name)
    recipe = DelayedScaling(Format[fmt], amax_history_len=3)
    state = make_state(recipe, device)["QKV"]
    fp8_dtype = Format[fmt].dtype("QKV")
    fmax = ref8.FP8_MAX[fp8_dtype]
    state.scale = torch.tensor(3.0, device=device)
    x = torch.randn(64, 33, device=device, dtype=torch.bfloat16) * 40
    x[0, :3] = torch.tensor([1e30, -1e30, fmax], dtype=torch.bfloat16)  # beyond max, and at it
    (got,) = state.fake_quant([x])
    want = ref8.fake_quant(x, torch.tensor(3.0, device=device), fp8_dtype)
    assert torch.equal(got, want)
    assert got[0, 0].item() == pytest.approx(fmax / 3.0, rel=2**-7)  # saturated, not inf/NaN
    assert got[0, 1].item() == pytest.approx(-fmax / 3.0, rel=2**-7)
    fresh = make_state(recipe, device)["QKV"]  # empty history
    fresh.scale = torch.tensor(3.0, device=device)
    fresh.fake_quant([torch.zeros(8, device=device)])  # amax 0 everywhere: keep the scale
    assert fresh.scale.item() == 3.0 and fresh.amax_history.max().item() == 0.0
    current = make_state(CurrentScaling(Format[fmt]), device)["QKV"]
    current.fake_quant([torch.zeros(8, device=device)])
    assert current.last_scale.item() == 1.0


def test_recipe_defaults_are_te():
    """te_fast's and te_ref's recipes default as TE 2.20.2's (common/recipe/__init__.py:253-256,
    303): HYBRID, margin 0, a history of 1024 amaxes, "max"."""
    _record("recipe_defaults", "cpu")
    fast, ref = DelayedScaling(), ref8.DelayedScaling()
    fields = ("margin", "amax_history_len", "amax_compute_algo")
    assert [getattr(fast, f) for f in fields] == [0, 1024, "max"], fast
    assert [getattr(ref, f) for f in fields] == [0, 1024, "max"], ref
    assert fast.fp8_format is Format.HYBRID and CurrentScaling().fp8_format is Format.HYBRID
    assert ref.fp8_format == ref8.CurrentScaling().fp8_format == "HYBRID"


def _off_grid_fraction(values: torch.Tensor, scale: torch.Tensor, fp8_dtype) -> float:
    """Share of nonzero values not on the fp8 grid (up to the bf16 rounding of dequantization)."""
    x = values.float() * scale
    x = x[x != 0]
    nearest = x.to(fp8_dtype).float()
    return ((x - nearest).abs() > x.abs() * 2**-7).float().mean().item()


@pytest.mark.per_adapter(device_name=DEVICES)
def test_hybrid_uses_e5m2_in_backward(adapter, device_name):
    """HYBRID: dequantized gradients sit on the E5M2 grid, the output on the E4M3 grid; with
    E4M3 throughout the gradients leave the E5M2 grid (so the check can tell them apart). The
    scales come from the adapter's state (``fp8_state``)."""
    case = sized(AttnCase("sbhd_sbhd_sbhd", "bf16", "causal", device=device_name))
    device = _ready(adapter, case, "hybrid_grid", "fp8_state")
    rng = torch.Generator().manual_seed(5)
    inputs = make_inputs(case, device, rng)
    fractions = {}
    for fmt in ("HYBRID", "E4M3"):
        module = _module(adapter, case)
        out, grads = _step(adapter, module, case, inputs, ref8.CurrentScaling(fmt))
        st = adapter.read_fp8_state(module)
        dq = grads["q"]
        fractions[fmt] = _off_grid_fraction(dq, st["dQKV"].scale_used, torch.float8_e5m2)
        assert _off_grid_fraction(out, st["O"].scale_used, torch.float8_e4m3fn) == 0.0
    assert fractions["HYBRID"] == 0.0, "HYBRID gradients are not on the E5M2 grid"
    assert fractions["E4M3"] > 0.1, "the grid check cannot tell E4M3 from E5M2"


# ----------------------------------------------------------------------------- Float8Tensor


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("layout", ("sbh3d", "thd_thd_thd"))
def test_fp8_output_is_float8tensor(layout, device_name):
    """fp8_output=True: a Float8Tensor of the nominal shape/dtype whose dequantize() is the
    fake-quantized output; ordinary ops see the dequantized value; gradients flow through."""
    _record("float8tensor", device_name, layout=layout)
    device = devices.require(device_name)
    case = _case(layout, "bf16", device_name)
    inputs = make_inputs(case, device, torch.Generator().manual_seed(3))
    recipe = DelayedScaling()
    plain, fp8_out = _te_fast_module(case), _te_fast_module(case)
    q, k, v, _ = inputs.views(inputs.leaves, case)
    ref = plain(q, k, v, **inputs.kwargs, fp8=True, fp8_meta={"recipe": recipe})
    leaves = {n: t.clone().requires_grad_() for n, t in inputs.leaves.items()}
    q, k, v, _ = inputs.views(leaves, case)
    out = fp8_out(q, k, v, **inputs.kwargs, fp8=True, fp8_meta={"recipe": recipe},
                  fp8_output=True)  # fmt: skip
    assert isinstance(out, Float8Tensor)
    assert out.shape == ref.shape and out.dtype == ref.dtype == torch.bfloat16
    assert out.fp8_dtype == torch.float8_e4m3fn and out.scale_inv.dtype == torch.float32
    assert torch.equal(out.dequantize(), ref)
    plus = out + 1
    assert type(plus) is torch.Tensor and torch.equal(plus, ref + 1)
    assert isinstance(out.detach(), Float8Tensor)
    (g,) = torch.autograd.grad(out.float().sum(), [leaves[next(iter(leaves))]])
    assert torch.isfinite(g).all() and g.abs().sum() > 0


# ----------------------------------------------------------------------------- compile, errors


@pytest.mark.parametrize("device_name", devices.device_params())
def test_eager_island_under_compile(device_name):
    """fullgraph=False: one graph break at the FP8 call, eager results. fullgraph=True: dynamo's
    disabled-function error. The same module without FP8 still compiles with fullgraph=True."""
    _record("eager_island", device_name)
    device = devices.require(device_name)
    case = _case("sbh3d", "bf16", device_name)
    inputs = make_inputs(case, device, torch.Generator().manual_seed(9))
    q, k, v, _ = inputs.views(inputs.leaves, case)
    kwargs = dict(inputs.kwargs, fp8=True, fp8_meta={"recipe": DelayedScaling()})
    eager, module = _te_fast_module(case), _te_fast_module(case)
    contracts.reset_compile_state()
    got = torch.compile(module, backend="aot_eager")(q, k, v, **kwargs)
    breaks = sum(counters["graph_break"].values())
    record.counters(graph_breaks=breaks)
    assert breaks == 1, f"expected exactly one graph break, got {dict(counters['graph_break'])}"
    assert torch.equal(got, eager(q, k, v, **kwargs))
    contracts.reset_compile_state()
    with pytest.raises(Exception, match="disable"):
        torch.compile(module, fullgraph=True, backend="aot_eager")(q, k, v, **kwargs)
    contracts.reset_compile_state()
    plain = dict(inputs.kwargs)
    out = torch.compile(module, fullgraph=True, backend="aot_eager")(q, k, v, **plain)
    contracts.assert_no_graph_breaks()
    assert torch.equal(out, module(q, k, v, **plain))


@pytest.mark.parametrize("device_name", devices.device_params())
def test_fp8_argument_errors(device_name):
    _record("errors", device_name)
    device = devices.require(device_name)
    case = _case("bshd_bshd_bshd", "bf16", device_name)
    inputs = make_inputs(case, device, torch.Generator().manual_seed(1))
    q, k, v, _ = inputs.views(inputs.leaves, case)
    module = _te_fast_module(case)
    with pytest.raises(ValueError, match="needs fp8_meta"):
        module(q, k, v, **inputs.kwargs, fp8=True)
    with pytest.raises(ValueError, match="fp8_output=True needs fp8=True"):
        module(q, k, v, **inputs.kwargs, fp8_output=True, fp8_meta={"recipe": DelayedScaling()})
    with pytest.raises(ValueError, match="recipe"):
        module(q, k, v, **inputs.kwargs, fp8=True, fp8_meta={"recipe": "hybrid"})
    bias = torch.zeros(1, 1, 1, case.skv, device=device, dtype=q.dtype)
    with pytest.raises(NotImplementedError, match="core_attention_bias_type"):
        biased = dict(inputs.kwargs, core_attention_bias_type="post_scale_bias",
                      core_attention_bias=bias)  # fmt: skip
        module(q, k, v, **biased, fp8=True, fp8_meta={"recipe": DelayedScaling()})
    with pytest.raises(ValueError, match="amax_compute_algo"):
        DelayedScaling(amax_compute_algo="mean")
    # te_ref's emulation rejects what it does not emulate, and bad recipes, alike
    state = ref8.FP8State(ref8.DelayedScaling(), device)
    with pytest.raises(NotImplementedError, match="core_attention_bias_type"):
        ref8.fp8_dot_product_attention(q, k, v, None, softmax_scale=1.0, fp8_state=state,
                                       **biased)  # fmt: skip
    with pytest.raises(ValueError, match="amax_compute_algo"):
        ref8.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="fp8_format"):
        ref8.CurrentScaling(fp8_format="E3M4")
    with pytest.raises(ValueError, match="recipe"):
        ref8.FP8State("hybrid")
