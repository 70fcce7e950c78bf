"""te_fast's own FP8 API (SPEC §5): its scaling state's edges and its quantizer (te_fast.fp8's
state object, fed tensors directly), the recipes' defaults (TE's), its Float8Tensor output, its
eager island under torch.compile and its FP8 argument errors. FP8 through every adapter that
declares it: suites/conformance/test_fp8.py."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import te_ref.fp8 as ref8
from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.cases import AttnCase, make_inputs
from te_conformance.suites.checks import contracts
from te_conformance.suites.fp8_cases import fp8_case
from te_fast.fp8 import CurrentScaling, DelayedScaling, Float8Tensor, Format, make_state

DEVICES = devices.device_params()
FLT_MAX = torch.finfo(torch.float32).max


def _record(name, device_name, **fields):
    """A case of te_fast's own FP8 API (the tests that do not go through an adapter)."""
    record.case(impl="te_fast.fp8", layout=fields.pop("layout", f"fp8:{name}"),
                device=device_name, **fields)  # fmt: skip


def _te_fast_module(case: AttnCase):
    """te_fast's module, for the tests of its own FP8 API."""
    from te_fast import UnfusedDotProductAttention

    return UnfusedDotProductAttention(case.d**-0.5, attention_type=case.attention_type)


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


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("layout", ("sbh3d", "thd_thd_thd"))
def test_fp8_output_is_float8tensor(layout, device_name):
    """fp8_output=True: a Float8Tensor of the nominal shape/dtype whose dequantize() is the
    fake-quantized output; ordinary ops see the dequantized value; gradients flow through."""
    _record("float8tensor", device_name, layout=layout)
    device = devices.require(device_name)
    case = fp8_case(layout, "bf16", device_name)
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
    # clone() is a Float8Tensor of its own: a later in-place update of the original's scale
    # (a recipe's step) or data leaves the copy as it was
    copy = out.detach().clone()
    assert isinstance(copy, Float8Tensor) and torch.equal(copy.dequantize(), ref)
    out.scale_inv.mul_(2)
    out._data.view(torch.uint8).zero_()
    assert torch.equal(copy.dequantize(), ref), "clone() shares its scale_inv or data"


@pytest.mark.parametrize("device_name", devices.device_params())
def test_eager_island_under_compile(device_name):
    """fullgraph=False: one graph break at the FP8 call, eager results. fullgraph=True: dynamo's
    disabled-function error. The same module without FP8 still compiles with fullgraph=True."""
    _record("eager_island", device_name)
    device = devices.require(device_name)
    case = fp8_case("sbh3d", "bf16", device_name)
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
    case = fp8_case("bshd_bshd_bshd", "bf16", device_name)
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
