"""FP8 emulation (SPEC §5) through every selected adapter that declares FP8 (docs/adapters.md):
an implementation against te_ref's emulation run on its own (te_ref keeps its own scaling state,
TE 2.20.2's recipes, over the same sequence of calls), grouped heads, the RMSE bound against the
same call without FP8, and, for adapters that also declare the ``fp8_state`` capability
(``read_fp8_state``), the scaling state: each role's amax and scales every pass, the three
literal passes (suites/fp8_cases.py) and the HYBRID grids. An adapter without ``fp8_state`` is
judged on its outputs and gradients alone. The suites hand an adapter te_ref.fp8's recipes
(TE's field names); ``Adapter.fp8_recipe`` makes the implementation's own. te_fast's own FP8
API: suites/te_fast/test_fp8_api.py."""

from __future__ import annotations

import zlib

import pytest
import torch

import te_ref.fp8 as ref8
from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.adapters import ready
from te_conformance.suites.adapters.base import FP8_ROLES as ROLES
from te_conformance.suites.adapters.base import Adapter
from te_conformance.suites.cases import AttnCase, make_inputs, sized
from te_conformance.suites.checks.numerics import K_BACKWARD, K_FORWARD, check_ratio, floor
from te_conformance.suites.fp8_cases import (
    THREE_PASS_KWARGS,
    THREE_PASS_RECIPES,
    THREE_PASS_VALUES,
    THREE_PASSES,
    fp8_case,
    three_pass_case,
    three_pass_inputs,
)

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
pytestmark = pytest.mark.feature("fp8")


def _ready(adapter: Adapter, case: AttnCase, check: str, *capabilities: str, **fields):
    """Record an adapter's FP8 case (``check``: which of this suite's checks); its device, or a
    skip with the reason where the adapter lacks the ``fp8`` capability or another it needs, or
    cannot run the case."""
    record.case(impl=f"{adapter.name}.fp8", check=check, **{**case.fields(), **fields})
    return ready(adapter, case, "fp8", *capabilities)


def _module(adapter: Adapter, case: AttnCase, softmax_scale: float | None = None):
    scale = case.d**-0.5 if softmax_scale is None else softmax_scale
    return adapter.build(case, scale)


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
        if not adapter.support.has("fp8_state", case.device):
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
    case = fp8_case(layout, dtype, device_name)
    device = _ready(adapter, case, "emulation", recipe=recipe_name)
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
    case = fp8_case(layout, "bf16", device_name, gqa=2 if heads == "gqa" else h)
    assert 1 <= case.hg < case.h
    device = _ready(adapter, case, "grouped_heads", recipe=recipe_name, heads=heads)
    _judge_sequence(adapter, case, device, recipe_name, zlib.crc32(case.id.encode()))


@pytest.mark.per_adapter(layout=FP8_LAYOUTS, recipe_name=list(RECIPES), device_name=DEVICES)
def test_fp8_close_to_f16(adapter, layout, recipe_name, device_name):
    """Transformer Engine's bound: RMSE(fp8 - f16) <= 0.11 x (max - min) of the f16 result."""
    case = fp8_case(layout, "bf16", device_name)
    device = _ready(adapter, case, "rmse_vs_f16", recipe=recipe_name)
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


@pytest.mark.per_adapter(recipe_name=list(THREE_PASSES), device_name=DEVICES)
def test_delayed_scaling_three_steps(adapter, recipe_name, device_name):
    """Every role's amax, the scale each step quantized with, the scale after it and the
    history, over three steps whose amaxes are known by hand: literal values typed from TE's
    formulas (THREE_PASSES), met exactly (adapters with ``fp8_state``). ``current``:
    Float8CurrentScaling, under which S and dP stay delayed."""
    case = three_pass_case(device_name)
    device = _ready(adapter, case, f"delayed_{recipe_name}", "fp8_state")
    table = THREE_PASSES[recipe_name]
    module = _module(adapter, case, softmax_scale=1.0)
    kwargs = dict(THREE_PASS_KWARGS, fp8=True,
                  fp8_meta={"recipe": adapter.fp8_recipe(THREE_PASS_RECIPES[recipe_name])})
    for step, (a, g) in enumerate(THREE_PASS_VALUES):
        q, k, v, grad_out = three_pass_inputs(a, g, device)
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


# ----------------------------------------------------------------------------- compile, errors


