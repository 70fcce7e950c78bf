"""The suites can fail: each contract assertion is run against an op or program that breaks it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.checks import broken_ops, contracts
from te_conformance.suites.checks.numerics import check_ratio


def _record(name, device_name):
    record.case(impl="selftest", layout=f"selftest:{name}", device=device_name)


@pytest.mark.parametrize("device_name", devices.device_params())
def test_catches_input_mutation(device_name):
    _record("writes_its_input", device_name)
    device = devices.require(device_name, needs_te_fast=False)
    x = torch.randn(4, 33, device=device)
    before = contracts.snapshot([x])
    broken_ops.writes_its_input(x)
    with pytest.raises(AssertionError, match="an input was written"):
        contracts.assert_untouched("x", before)


@pytest.mark.parametrize("device_name", devices.device_params())
def test_catches_aliased_output(device_name):
    _record("aliased_output", device_name)
    device = devices.require(device_name, needs_te_fast=False)
    x = torch.randn(4, 33, device=device)
    with pytest.raises(AssertionError, match="shares storage"):
        contracts.assert_fresh_storage([x[1:]], [x])


@pytest.mark.parametrize("device_name", devices.device_params())
def test_catches_unwritten_output(device_name):
    """An op that leaves its last row as allocated fails the fully-written check (the poison is
    NaN there), and so does an output whose buffer the poison never reached (a workspace made
    before the check: the check would be void), while the whole softmax passes."""
    _record("last_row_unwritten", device_name)
    device = devices.require(device_name, needs_te_fast=False)
    x = torch.randn(5, 33, device=device)
    expected = torch.softmax(x, -1)
    contracts.assert_fully_written("whole", lambda: torch.empty_like(x).copy_(expected), expected)
    with pytest.raises(AssertionError, match="33 of 165 output elements were left unwritten"):
        contracts.assert_fully_written(
            "last_row_unwritten", lambda: broken_ops.last_row_unwritten(x), expected
        )
    workspace = torch.empty_like(x)
    with pytest.raises(AssertionError, match="poison was not seen"):
        contracts.assert_fully_written(
            "workspace", lambda: torch.mul(expected, 1.0, out=workspace), expected
        )


_CAPTURE_PROGRAM = """
import torch
from te_conformance.suites.checks import broken_ops
from te_conformance.suites.checks import contracts
static = [torch.randn(4, 33, device="cuda")]
try:
    contracts.assert_graph_replay_matches_eager(
        broken_ops.{op}, static, lambda a: a[0].copy_(torch.randn_like(a[0]))
    )
except AssertionError as e:
    print("CAUGHT:", e)
else:
    print("NOT CAUGHT")
"""


def _capture_in_subprocess(op: str) -> str:
    """Run the capture check on a broken op in a fresh process: a capture that a broken op
    breaks leaves CUDA's RNG in capture mode for the rest of the process (seen on an H200:
    later tests in the same xdist worker failed with "Offset increment outside graph capture")."""
    root = Path(__file__).resolve().parents[2]  # the checkout: suites/judge/ -> ..
    result = subprocess.run(
        [sys.executable, "-c", _CAPTURE_PROGRAM.format(op=op)],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return result.stdout + result.stderr


@pytest.mark.gpu
def test_catches_default_stream_launch():
    _record("default_stream_launch", "cuda")
    devices.require("cuda", needs_te_fast=False)
    output = _capture_in_subprocess("default_stream_launch")
    # seen on an H200 (torch 2.11): the launch escapes the capture ("The CUDA Graph is empty"),
    # so capture succeeds and the replay returns stale output; either way the check must fail
    assert re.search(r"CAUGHT: (CUDA graph capture failed|graph replay vs eager)", output), output


@pytest.mark.gpu
def test_catches_host_sync():
    _record("reads_item", "cuda")
    device = devices.require("cuda", needs_te_fast=False)
    x = torch.randn(4, 33, device=device)
    with pytest.raises(AssertionError, match="host synchronisation"):
        contracts.assert_no_host_sync(lambda: broken_ops.reads_item(x))
    output = _capture_in_subprocess("reads_item")
    assert "CAUGHT: CUDA graph capture failed" in output, output


@pytest.mark.parametrize("device_name", devices.device_params())
def test_catches_graph_break(device_name):
    _record("graph_break", device_name)
    device = devices.require(device_name, needs_te_fast=False)

    def fn(x):
        y = torch.softmax(x, -1)
        torch._dynamo.graph_break()
        return y * 2

    contracts.reset_compile_state()
    torch.compile(fn, backend="aot_eager")(torch.randn(4, 8, device=device))
    with pytest.raises(AssertionError, match="graph breaks"):
        contracts.assert_no_graph_breaks()


@pytest.mark.gpu
def test_catches_cudagraph_skip():
    """An input mutation inside a reduce-overhead graph makes inductor skip cudagraphs."""
    _record("cudagraph_skip", "cuda")
    device = devices.require("cuda", needs_te_fast=False)

    def fn(x):
        x.add_(1)
        return torch.softmax(x, -1)

    contracts.reset_compile_state()
    compiled = torch.compile(fn, mode="reduce-overhead")
    for _ in range(3):
        compiled(torch.randn(4, 8, device=device))
    with pytest.raises(AssertionError, match="skipped"):
        contracts.assert_no_cudagraph_skips()


@pytest.mark.gpu
def test_catches_nothing_replayed():
    """Compiled without CUDA graphs: the positive replay signal must fail."""
    _record("no_cudagraphs", "cuda")
    device = devices.require("cuda", needs_te_fast=False)
    contracts.reset_compile_state()
    compiled = torch.compile(lambda x: torch.softmax(x, -1) * 2, mode="default")
    x = torch.randn(4, 8, device=device)
    for _ in range(3):
        compiled(x)
    launches = contracts.count_graph_launches(lambda: compiled(x))
    with pytest.raises(AssertionError, match="nothing"):
        contracts.assert_graphs_replayed(launches)


def test_catches_wrong_numerics():
    """A softmax that ignores its scale fails the error-ratio rule."""
    _record("wrong_scale", "cpu")
    x = torch.randn(3, 50, dtype=torch.bfloat16)
    ref64 = torch.softmax(x.double() * 0.5, -1)
    ref_lp = torch.softmax(x * 0.5, -1)
    wrong = torch.softmax(x.float(), -1).to(torch.bfloat16)
    with record.suspended(), pytest.raises(AssertionError, match="ratio"):
        check_ratio("y", wrong, ref64, ref_lp, 2.0)


def test_ratio_rule_on_non_finite_values():
    """The rule never passes by an infinite bound: a NaN-poisoned reference row needs NaN in the
    implementation (0 there fails), equal infinities are exact, and a same-precision reference
    that is NaN where float64 is not is an error, not a pass of anything."""
    _record("ratio_non_finite", "cpu")
    nan, inf = float("nan"), float("inf")
    ref64 = torch.tensor([0.25, 0.75, nan, -inf], dtype=torch.float64)
    ref_lp = torch.tensor([0.25, 0.75, nan, -inf])
    with record.suspended():
        assert check_ratio("y", torch.tensor([0.25, 0.75, nan, -inf]), ref64, ref_lp, 2.0) == 0
        with pytest.raises(AssertionError, match="ratio inf"):
            check_ratio("y", torch.tensor([0.25, 0.75, 0.0, -inf]), ref64, ref_lp, 2.0)
        with pytest.raises(AssertionError, match="ratio"):  # one finite value wrong
            check_ratio("y", torch.tensor([0.25, 0.5, nan, -inf]), ref64, ref_lp, 2.0)
        vacuous = torch.tensor([0.25, nan, nan, -inf])  # the composite NaN where float64 is not
        with pytest.raises(AssertionError, match="cannot be judged"):
            check_ratio("y", torch.tensor([0.25, 0.5, nan, -inf]), ref64, vacuous, 2.0)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=("fp32", "bf16"))
def test_ratio_rule_tiny_tensor_floor(dtype):
    """SPEC §6's tiny-tensor floor: under 64 elements, 8 ulps of the largest |ref64| (ulp =
    eps * 2**floor(log2 max|ref64|)); at 64 elements the per-dtype floor eps/64 alone. Here the
    same-precision reference is exact, so the bound is the floor itself."""
    _record(f"ratio_tiny_floor_{dtype}", "cpu")
    eps = torch.finfo(dtype).eps
    with record.suspended():
        for n in (1, 7, 63):
            ref64 = torch.full((n,), 1.5, dtype=torch.float64)
            ref64[0] = -3.0  # largest |value| 3.0: its ulp is eps * 2
            ref_lp = ref64.to(dtype)
            ok = ref64.clone()
            ok[-1] += 8 * 2 * eps  # exactly the floor: passes
            assert check_ratio("y", ok, ref64, ref_lp, 2.0, dtype) == 1.0
            bad = ref64.clone()
            bad[-1] += 8.5 * 2 * eps
            with pytest.raises(AssertionError, match=rf"tiny tensor: {n} elements; 8 ulps"):
                check_ratio("y", bad, ref64, ref_lp, 2.0, dtype)
        ref64 = torch.full((64,), 1.5, dtype=torch.float64)
        one_ulp = ref64.clone()
        one_ulp[-1] += eps  # one ulp off at 1.5, 64x the per-dtype floor
        with pytest.raises(AssertionError, match=r"floor [0-9.e-]+\); ratio"):
            check_ratio("y", one_ulp, ref64, ref64.to(dtype), 2.0, dtype)
        zeros = torch.zeros(3, dtype=torch.float64)  # no magnitude: the per-dtype floor
        with pytest.raises(AssertionError, match="per-dtype floor"):
            check_ratio("y", zeros + eps, zeros, zeros.to(dtype), 2.0, dtype)


def _judged_case(**fields):
    """A small CPU case with its inputs and both references (te_ref)."""
    from te_conformance.suites.cases import AttnCase, make_inputs
    from te_conformance.suites.checks.attention import reference

    shape = {"dtype": "fp32", "mask_type": "causal", "b": 1, "sq": 16, "skv": 16, "h": 2,
             "hg": 2, "d": 16, "dv": 16, **fields}  # fmt: skip
    case = AttnCase("bshd_bshd_bshd", device="cpu", **shape)
    inputs = make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(3))
    refs = [reference(case, inputs, how, case.softmax_scale)
            for how in ("float64", "same_precision")]  # fmt: skip
    return case, inputs, *refs


def test_max_logit_is_judged_by_one_ulp_of_the_case_dtype():
    """SPEC §6: max_logit's tiny-tensor term is 1 ulp of the case's dtype, not 8. With 8 bf16
    ulps (0.13-0.15 for a max_logit of 4-8) a max_logit 2% high passed; with fp32's floor,
    te_fast's own CUDA max_logit (0.15-0.73 ulp off) failed. A max_logit 3/4 of a bf16 ulp off
    passes; one 2% high fails."""
    from te_conformance.suites.checks.attention import judge
    from te_conformance.suites.checks.numerics import ulp

    _record("max_logit_one_ulp", "cpu")
    case, inputs, ref64, ref_lp = _judged_case(dtype="bf16", return_max_logit=True)
    out64, ml64, grads64 = ref64
    good = (out64.to(torch.bfloat16), ml64.float(),
            {n: g.to(ref_lp[2][n].dtype) for n, g in grads64.items()})  # fmt: skip
    top = ml64.abs().max().item()
    near = ml64 + 0.75 * ulp(torch.bfloat16, top) * torch.sign(ml64)
    with record.suspended():
        judge(case, inputs, good, ref64, ref_lp)  # the float64 answer in fp32 passes
        judge(case, inputs, (good[0], near.float(), good[2]), ref64, ref_lp)
        with pytest.raises(AssertionError, match="max_logit: max"):
            judge(case, inputs, (good[0], good[1] * 1.02, good[2]), ref64, ref_lp)


def test_judge_applies_k_forward_and_k_backward():
    """SPEC §6's k: 2 for the output, 3 for the gradients, as judge() applies them. An output
    off by 2.5x the same-precision composite's error fails where 1.5x passes; a gradient off by
    3.5x fails where 2.5x passes (the floor, eps/64, is far below those errors)."""
    from te_conformance.suites.checks.attention import judge
    from te_conformance.suites.checks.numerics import K_BACKWARD, K_FORWARD

    _record("k_factors", "cpu")
    assert (K_FORWARD, K_BACKWARD) == (2.0, 3.0)  # SPEC §6
    case, inputs, ref64, ref_lp = _judged_case()

    def off(times, which):  # every tensor at 1x its composite's error, `which` at `times`
        scale = lambda name: times if name == which else 1.0  # noqa: E731
        out = ref64[0] + scale("out") * (ref_lp[0] - ref64[0])
        grads = {n: g + scale(n) * (ref_lp[2][n] - g) for n, g in ref64[2].items()}
        return out.float(), None, {n: g.float() for n, g in grads.items()}

    with record.suspended():
        judge(case, inputs, off(1.5, "out"), ref64, ref_lp)
        judge(case, inputs, off(2.5, "v"), ref64, ref_lp)
        with pytest.raises(AssertionError, match="out: max"):
            judge(case, inputs, off(2.5, "out"), ref64, ref_lp)
        with pytest.raises(AssertionError, match="dv: max"):
            judge(case, inputs, off(3.5, "v"), ref64, ref_lp)


def test_the_input_watch_sees_a_write_to_a_padding_mask_pair():
    """run_impl(watch=True) holds every tensor of the call, those inside a (q_mask, kv_mask)
    pair too: an implementation that writes into the kv mask fails as an input written."""
    from te_conformance.suites.adapters import ADAPTERS
    from te_conformance.suites.checks.attention import run_impl

    _record("writes_mask_pair", "cpu")
    case, inputs, _, _ = _judged_case(mask_type="padding", padding_from="mask", skv=12)
    mask = inputs.kwargs["attention_mask"]
    assert isinstance(mask, tuple), "precondition: a cross padding mask is a (q, kv) pair"
    te_fast = ADAPTERS["te_fast"]

    class WritesItsMask:
        name = "writes_its_mask"

        def call(self, module, case, q, k, v, kwargs):
            result = te_fast.call(module, case, q, k, v, kwargs)
            kwargs["attention_mask"][1].view(-1)[0] ^= True  # after use: the values still pass
            return result

    module = te_fast.build(case, case.softmax_scale)
    run_impl(te_fast, module, case, inputs, watch=True)  # the honest call passes the watch
    with pytest.raises(AssertionError, match="an input was written"):
        run_impl(WritesItsMask(), module, case, inputs, watch=True)


# ----------------------------------------------------------------------------- fuzz checks
# The property-based suite (suites/conformance/test_fuzz.py) run on deliberately broken stand-ins
# (suites/checks/broken_ops.py): each must be found, shrunk and printed with a reproducer.

HYPOTHESIS_MISSING = "hypothesis is not installed (pip install -e '.[test]')"


def _fuzz_failure(check, strategy, match: str, examples: int = 100, **extra) -> AssertionError:
    pytest.importorskip("hypothesis", reason=HYPOTHESIS_MISSING)
    from te_conformance.suites.fuzz import strategies as fs

    with record.suspended(), pytest.raises(AssertionError, match=match) as info:
        fs.fuzz(check, strategy, "cpu", examples, **extra)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    headers = ("Failing test case", "Falsifying example", "Failing explicit example")
    assert any(h in notes for h in headers), notes
    assert "reproduce (from the repository root)" in notes, notes
    return info.value


@pytest.mark.parametrize(
    "broken,op,match",
    [
        ("masks_in_place", "scaled_masked_softmax", "an input was written"),
        ("subtracts_in_dy", "scaled_softmax", "an input was written"),
        ("dx_in_dy", "scaled_upper_triang_masked_softmax", "shares storage"),
        ("keeps_input_strides", "scaled_aligned_causal_masked_softmax", "the fake gives"),
        ("uniform_masked_rows", "scaled_masked_softmax", r"y[^:]*: max .* > bound"),
    ],
)
def test_fuzz_catches_broken_softmax(broken, op, match):
    _record(f"fuzz_{broken}", "cpu")
    devices.require("cpu")
    pytest.importorskip("hypothesis", reason=HYPOTHESIS_MISSING)
    from te_conformance.suites.fuzz import checks as fc
    from te_conformance.suites.fuzz import strategies as fs

    impl = getattr(broken_ops, broken)
    _fuzz_failure(fc.check_softmax_example, fs.softmax_examples(op, "cpu"), match, impl=impl)


@pytest.mark.parametrize("direction", ["thd_to_bshd", "bshd_to_thd"])
def test_fuzz_catches_aliasing_conversion(direction):
    """A view returned as the output is an alias even where it starts elsewhere in the storage
    or holds no element (storage spans, not pointers)."""
    _record(f"fuzz_convert_no_copy_{direction}", "cpu")
    devices.require("cpu")
    pytest.importorskip("hypothesis", reason=HYPOTHESIS_MISSING)
    from te_conformance.suites.fuzz import checks as fc
    from te_conformance.suites.fuzz import strategies as fs

    # With the fuzz's explicit examples, as test_fuzz.py runs it: one of them is a full sequence,
    # the case this defect needs (no padding, no trailing token), which the drawn examples reach
    # only by chance (their derandomized draws changed with the import order: the test failed
    # after suites/conformance/test_determinism.py in one process).
    _fuzz_failure(
        fc.check_convert_example, fs.convert_examples(direction), "shares storage",
        examples=500, impl=broken_ops.convert_no_copy, explicit=fs.convert_explicit(direction),
    )  # fmt: skip


@pytest.mark.parametrize(
    "adapter_name,match",
    [
        ("selftest.mutates_query", "an input was written"),
        ("selftest.aliases_value", "shares storage"),
        # the fuzz draws the softmax scale (strategies.SCALE_FACTORS): a module that computes
        # at the default d ** -0.5 whatever it was built with fails on the values
        pytest.param("selftest.ignores_scale", r"max \|impl - ref64\|",
                     id="selftest.ignores_scale-values"),
    ],
)
def test_fuzz_catches_broken_module(adapter_name, match):
    _record(f"fuzz_{adapter_name}", "cpu")
    devices.require("cpu")
    pytest.importorskip("hypothesis", reason=HYPOTHESIS_MISSING)
    from te_conformance.suites.fuzz import checks as fc
    from te_conformance.suites.fuzz import strategies as fs

    adapter = broken_ops.BROKEN_ADAPTERS[adapter_name]
    _fuzz_failure(
        fc.check_module_example, fs.module_examples("bshd", "cpu"), match, examples=40,
        adapter=adapter,
    )  # fmt: skip


# ----------------------------------------------------------------------------- determinism


def test_determinism_catches_jitter():
    """An op whose output varies by one ulp from call to call fails the 10-run check."""
    _record("jittery", "cpu")
    devices.require("cpu")
    from te_conformance.suites.checks import invariance

    with pytest.raises(AssertionError, match=r"run \d+ vs run 0: \d+ bytes differ"):
        invariance.check_determinism("scaled_softmax", "fp32", "cpu", 100, impl=broken_ops.jittery)


@pytest.mark.parametrize("sk", [32, 1000])
def test_batch_invariance_catches_batch_variant(sk):
    """A softmax whose row sums depend on the batch size fails the batch-invariance check."""
    _record(f"batch_variant_sk{sk}", "cpu")
    devices.require("cpu")
    from te_conformance.suites.checks import invariance

    with pytest.raises(AssertionError, match="bytes differ"):
        invariance.check_batch_invariance(
            "scaled_softmax", "fp32", "cpu", sk, impl=broken_ops.batch_variant
        )


def test_module_determinism_catches_jitter():
    _record("jittery_module", "cpu")
    device = devices.require("cpu")
    from te_conformance.suites.cases import AttnCase
    from te_conformance.suites.checks import invariance

    case = AttnCase("bshd_bshd_bshd", "fp32", "causal", device="cpu", b=2, sq=9, skv=9, h=2,
                    hg=2, d=8, dv=8)  # fmt: skip
    adapter = broken_ops.BROKEN_ADAPTERS["selftest.jittery_output"]
    with pytest.raises(AssertionError, match="out: .*bytes differ"):
        invariance.check_module_determinism(case, device, adapter=adapter)


def test_dropout_seed_check_catches_unseeded_dropout():
    _record("unseeded_dropout", "cpu")
    device = devices.require("cpu")
    from te_conformance.suites.cases import AttnCase
    from te_conformance.suites.checks import invariance

    case = AttnCase("bshd_bshd_bshd", "fp32", "causal", device="cpu", b=2, sq=9, skv=9, h=2,
                    hg=2, d=8, dv=8)  # fmt: skip
    adapter = broken_ops.BROKEN_ADAPTERS["selftest.unseeded_dropout"]
    with pytest.raises(AssertionError, match="seed 1234, run 1 vs run 0: out"):
        invariance.check_dropout_seeded(case, device, adapter=adapter)
