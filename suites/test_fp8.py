"""FP8 emulation (SPEC §5): te_fast against te_ref's emulation, scaling state, formats,
saturation, Float8Tensor, and the eager island under torch.compile."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch._dynamo.utils import counters

import te_ref.fp8 as ref8
from reports import record
from suites import devices
from suites.cases import AttnCase, make_inputs, sized
from suites.checks import contracts
from suites.checks.numerics import K_BACKWARD, K_FORWARD, check_ratio
from te_fast.fp8 import CurrentScaling, DelayedScaling, Float8Tensor, Format, make_state

FP8_LAYOUTS = ("sbh3d", "bshd_bshd_bshd", "sbhd_sbhd_sbhd", "thd_thd_thd")
RECIPES = {"delayed": DelayedScaling(amax_history_len=4), "current": CurrentScaling()}
ROLES = ("QKV", "S", "O", "dO", "dP", "dQKV")


def _record(name, device_name, **fields):
    record.case(impl="te_fast.fp8", layout=fields.pop("layout", f"fp8:{name}"),
                device=device_name, **fields)  # fmt: skip


def _module(case: AttnCase):
    from te_fast import UnfusedDotProductAttention

    return UnfusedDotProductAttention(case.d**-0.5, attention_type=case.attention_type)


def _step(module, case, inputs, recipe, fp8=True):
    """One forward and backward; returns (out, {leaf: grad})."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.leaves.items()}
    q, k, v, _ = inputs.views(leaves, case)
    out = module(q, k, v, **inputs.kwargs, fp8=fp8, fp8_meta={"recipe": recipe})
    grads = torch.autograd.grad(out, list(leaves.values()), inputs.grad_out)
    return out.detach(), dict(zip(leaves, grads))


def _case(layout, dtype, device_name):
    mask = "padding_causal" if layout.startswith("thd") else "causal"
    return sized(AttnCase(layout, dtype, mask, device=device_name))


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("dtype", ("bf16", "fp16"))
@pytest.mark.parametrize("layout", FP8_LAYOUTS)
def test_fp8_matches_reference_emulation(layout, dtype, recipe_name, device_name):
    """te_fast's FP8 forward and backward against te_ref's emulation with the same scales
    (error-ratio rule: te_ref in float64 between quantization points vs in the input dtype),
    and the scaling state te_fast keeps against te_ref's update rule."""
    case = _case(layout, dtype, device_name)
    _record("emulation", device_name, layout=layout, dtype=dtype, mask_type=case.mask_type,
            recipe=recipe_name)  # fmt: skip
    device = devices.require(device_name)
    recipe = RECIPES[recipe_name]
    rng = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    base = make_inputs(case, device, rng)
    module = _module(case)
    _step(module, case, base.with_fresh_values(rng), recipe)  # warm-up: delayed scales now real
    before = module.fp8_state
    inputs = base.with_fresh_values(rng)
    out, grads = _step(module, case, inputs, recipe)
    after = module.fp8_state
    scales = {r: after[r].last_scale for r in ROLES}
    formats = {r: recipe.fp8_format.dtype(r) for r in ROLES}

    def reference(compute_dtype):
        q, k, v, _ = inputs.views(inputs.leaves, case)
        return ref8.fp8_dot_product_attention(
            q, k, v, inputs.grad_out, softmax_scale=case.d**-0.5, scales=scales,
            formats=formats, compute_dtype=compute_dtype, **inputs.kwargs,
        )  # fmt: skip

    out64, grads64, amax64 = reference(torch.float64)
    out_lp, grads_lp, _ = reference(out.dtype)
    dq, dk, dv, _ = inputs.views(grads, case)
    check_ratio("out", out, out64, out_lp, K_FORWARD)
    for name, g, g64, g_lp in zip(("dq", "dk", "dv"), (dq, dk, dv), grads64, grads_lp):
        check_ratio(name, g, g64, g_lp, K_BACKWARD)

    for role in ROLES:
        st0, st1 = before[role], after[role]
        amax = st1.amax_history[0]
        assert torch.allclose(amax, amax64[role].float(), rtol=2**-5), (
            f"{role}: recorded amax {amax.item()} vs reference {amax64[role].item()}"
        )
        if role in ("S", "dP") or recipe_name == "delayed":  # delayed: the pre-step scale
            assert torch.equal(st1.last_scale, st0.scale), f"{role} did not use its delayed scale"
            algo = getattr(recipe, "amax_compute_algo", "most_recent")
            margin = getattr(recipe, "margin", 0)
            hist, scale = ref8.update_delayed(
                st0.amax_history, st0.scale, amax, formats[role], margin, algo
            )
            assert torch.equal(st1.amax_history, hist), f"{role}: history {st1.amax_history}"
            assert torch.allclose(st1.scale, scale, rtol=1e-6), f"{role}: next scale"
        else:  # current scaling: this tensor's own amax
            assert torch.allclose(
                st1.last_scale, ref8.current_scale(amax, formats[role]), rtol=1e-6
            ), f"{role}: current scale"
    # Q, K, V are the same tensors in both: their shared current scale must agree exactly
    if recipe_name == "current":
        expected = ref8.current_scale(amax64["QKV"].float(), formats["QKV"])
        assert torch.equal(after["QKV"].last_scale, expected)


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("recipe_name", list(RECIPES))
@pytest.mark.parametrize("layout", FP8_LAYOUTS)
def test_fp8_close_to_f16(layout, recipe_name, device_name):
    """Transformer Engine's bound: RMSE(fp8 - f16) <= 0.11 x (max - min) of the f16 result."""
    case = _case(layout, "bf16", device_name)
    _record("rmse_vs_f16", device_name, layout=layout, dtype="bf16", recipe=recipe_name)
    device = devices.require(device_name)
    recipe = RECIPES[recipe_name]
    rng = torch.Generator().manual_seed(11)
    base = make_inputs(case, device, rng)
    module = _module(case)
    _step(module, case, base.with_fresh_values(rng), recipe)
    inputs = base.with_fresh_values(rng)
    out8, grads8 = _step(module, case, inputs, recipe)
    out16, grads16 = _step(module, case, inputs, recipe, fp8=False)
    pairs = [("out", out8, out16)] + [(f"d{n}", grads8[n], grads16[n]) for n in grads16]
    for name, a, b in pairs:
        a, b = a.double(), b.double()
        rmse = (a - b).pow(2).mean().sqrt().item()
        bound = 0.11 * (b.max() - b.min()).item()
        record.tensor(name, rmse, bound, rmse / bound, metric="rmse_vs_f16")
        assert rmse <= bound, f"{name}: RMSE {rmse:.4g} > 0.11 x range = {bound:.4g}"


# ----------------------------------------------------------------------------- scaling details


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("algo", ("max", "most_recent"))
def test_delayed_scaling_three_steps(algo, device_name):
    """QKV amax 2, 8, 4 over three steps, history length 2, margin 1, E4M3 forward:
    each step quantizes with the scale from the steps before it; the history rolls after use."""
    _record(f"delayed_{algo}", device_name)
    device = devices.require(device_name)
    recipe = DelayedScaling(Format.HYBRID, margin=1, amax_history_len=2, amax_compute_algo=algo)
    case = sized(AttnCase("bshd_bshd_bshd", "bf16", "causal", device=device_name))
    module = _module(case)
    expect_used = [1.0]
    history: list[float] = [0.0, 0.0]
    for amax in (2.0, 8.0, 4.0):
        q = (torch.rand(case.b, case.sq, case.h, case.d, device=device) - 0.5).to(torch.bfloat16)
        q[0, 0, 0, 0] = amax
        module(q, q * 0.25, q * 0.5, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal",
               fp8=True, fp8_meta={"recipe": recipe})  # fmt: skip
        st = module.fp8_state["QKV"]
        history = [amax, history[0]]
        chosen = max(history) if algo == "max" else history[0]
        assert st.last_scale.item() == pytest.approx(expect_used[-1], rel=1e-6)
        assert st.amax_history.tolist() == history
        assert st.scale.item() == pytest.approx(448.0 / chosen / 2, rel=1e-6)
        expect_used.append(448.0 / chosen / 2)
    # after steps (2), (8, 2), (4, 8): "max" keeps 8, "most_recent" follows 4
    assert expect_used[-1] == (448.0 / 8 / 2 if algo == "max" else 448.0 / 4 / 2)


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


def _off_grid_fraction(values: torch.Tensor, scale: torch.Tensor, fp8_dtype) -> float:
    """Share of nonzero values not on the fp8 grid (up to the bf16 rounding of dequantization)."""
    x = values.float() * scale
    x = x[x != 0]
    nearest = x.to(fp8_dtype).float()
    return ((x - nearest).abs() > x.abs() * 2**-7).float().mean().item()


@pytest.mark.parametrize("device_name", devices.device_params())
def test_hybrid_uses_e5m2_in_backward(device_name):
    """HYBRID: dequantized gradients sit on the E5M2 grid, the output on the E4M3 grid; with
    E4M3 throughout the gradients leave the E5M2 grid (so the check can tell them apart)."""
    _record("hybrid_grid", device_name)
    device = devices.require(device_name)
    case = sized(AttnCase("sbhd_sbhd_sbhd", "bf16", "causal", device=device_name))
    rng = torch.Generator().manual_seed(5)
    inputs = make_inputs(case, device, rng)
    fractions = {}
    for fmt in (Format.HYBRID, Format.E4M3):
        module = _module(case)
        out, grads = _step(module, case, inputs, CurrentScaling(fmt))
        st = module.fp8_state
        dq = grads["q"]
        fractions[fmt] = _off_grid_fraction(dq, st["dQKV"].last_scale, torch.float8_e5m2)
        assert _off_grid_fraction(out, st["O"].last_scale, torch.float8_e4m3fn) == 0.0
    assert fractions[Format.HYBRID] == 0.0, "HYBRID gradients are not on the E5M2 grid"
    assert fractions[Format.E4M3] > 0.1, "the grid check cannot tell E4M3 from E5M2"


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
    plain, fp8_out = _module(case), _module(case)
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
    eager, module = _module(case), _module(case)
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
    module = _module(case)
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
