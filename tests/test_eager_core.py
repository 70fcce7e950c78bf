"""te_fast's eager core (te_fast/_eager.py core): plain eager fp16/bf16 calls with at least 64 MiB
of scores run BMM1 -> softmax -> BMM2 and the backward as one autograd node on the strided
inputs, slice by slice along the batch or head axis (UnfusedDotProductAttention(
score_chunk_bytes=...), 256 MiB by default), so that only one slice's scores (forward) or dP and
dS (backward) sit beside P. The suites' shapes are below that size (the ops path; the module
benchmark and test_large's THD module case run the core): here the size threshold is 0 and the
slice size is set on the class (so for every module the adapter builds) small enough that every
mask kernel, GQA, both layout families and
both split axes go through several slices, judged against te_ref under SPEC §6 (with the
no-alias and no-mutation checks), and bit for bit on the CPU against one slice and against the
path that records torch.matmul and the softmax op separately (te_fast's rows are
batch-invariant; CPU matmuls per slice are the same matmuls). Each way _matmul_into can run a
GEMM (one folded batched GEMM, one per batch element, via copies) is compared the same way."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

te_fast = pytest.importorskip("te_fast")
if te_fast.UNAVAILABLE_REASON is not None:
    pytest.skip(f"te_fast unavailable: {te_fast.UNAVAILABLE_REASON}", allow_module_level=True)

from suites.attention_check import run_impl  # noqa: E402
from suites.cases import AttnCase, make_inputs  # noqa: E402
from suites.devices import device_params, require  # noqa: E402
from suites.fuzz_checks import ModuleExample, check_module_example  # noqa: E402
from suites.impls import ADAPTERS  # noqa: E402
from te_fast import _eager  # noqa: E402
from te_fast.attention import UnfusedDotProductAttention  # noqa: E402

BASE = AttnCase(layout="bshd_bshd_bshd", dtype="bf16", mask_type="causal", device="cpu",
                b=3, sq=19, skv=19, h=4, hg=4, d=16, dv=16)  # fmt: skip
CASES = {
    "causal": BASE,
    "causal_bottom_right-cross": replace(BASE, mask_type="causal_bottom_right", skv=27),
    "no_mask-gqa-fp16": replace(BASE, mask_type="no_mask", hg=2, dtype="fp16"),
    "padding-sbhd": replace(BASE, layout="sbhd_sbhd_sbhd", mask_type="padding"),
    "padding_causal-mask": replace(BASE, mask_type="padding_causal", padding_from="mask"),
    "padding_causal_bottom_right-thd": replace(
        BASE, layout="thd_thd_thd", mask_type="padding_causal_bottom_right", skv=23
    ),
    "arbitrary-mqa": replace(BASE, mask_type="arbitrary", hg=1),
    "causal-window": replace(BASE, window=(3, 0)),
}
# Slice sizes in bytes of one score tensor: b=3 slices of the batch (two uneven ones), and the
# head axis (more slices than batch elements).
SPLITS = {"batch": 3 * 4 * 19 * 27 * 2 // 2, "heads": 1}


@pytest.fixture(autouse=True)
def core_at_any_size(monkeypatch):
    """The core runs from 64 MiB of scores by default; these tests' shapes are far smaller."""
    monkeypatch.setattr(UnfusedDotProductAttention, "core_min_score_bytes", 0)


@pytest.fixture
def chunked(monkeypatch, request):
    """Force the chunk size; count the calls that take the chunked core."""
    calls = []
    real = _eager.core

    def spy(*args, **kwargs):
        calls.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(UnfusedDotProductAttention, "score_chunk_bytes", SPLITS[request.param])
    monkeypatch.setattr(_eager, "core", spy)
    return calls


def _results(case, seed=0):
    dev = torch.device(case.device)
    inputs = make_inputs(case, dev, torch.Generator().manual_seed(seed))
    module = ADAPTERS["te_fast"].build(case, case.d**-0.5)
    return run_impl(ADAPTERS["te_fast"], module, case, inputs)


@pytest.mark.parametrize("chunked", list(SPLITS), indirect=True)
@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", list(CASES))
def test_core_against_te_ref(name, device, chunked):
    require(device)
    case = replace(CASES[name], device=device)
    check_module_example(ModuleExample(case=case, seed=7), device)
    assert chunked, "the chunked core did not run"
    axis, bounds = chunked[0]
    assert len(bounds) > 1 and bounds[0][0] == 0 and bounds[-1][1] == (case.b, case.h)[axis]


def _ops_path(monkeypatch):
    """Make modules record torch.matmul and the softmax op separately (the path traces take)."""
    monkeypatch.setattr(UnfusedDotProductAttention, "_core_plan", lambda *a: None)


def _assert_same(a, b):
    out, _, grads = a
    out_b, _, grads_b = b
    assert torch.equal(out, out_b)
    for n in grads:
        assert torch.equal(grads[n], grads_b[n]), n


@pytest.mark.parametrize("chunked", list(SPLITS), indirect=True)
@pytest.mark.parametrize("name", list(CASES))
def test_core_slices_equal_one_slice_and_the_ops_path_on_cpu(name, chunked, monkeypatch):
    case = CASES[name]
    sliced = _results(case)
    assert chunked, "the core did not run"
    monkeypatch.setattr(UnfusedDotProductAttention, "score_chunk_bytes", None)
    _assert_same(sliced, _results(case))
    assert len(chunked) == 2 and chunked[1] == (0, [(0, case.b)]), "None: one slice"
    _ops_path(monkeypatch)
    _assert_same(sliced, _results(case))
    assert len(chunked) == 2, "the ops path took the core"


@pytest.mark.parametrize("way", ["default", "per_element", "copies"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_core_gemm_ways_equal_the_ops_path_on_cpu(way, fmt, monkeypatch):
    """sbhd views fold (b, h) into one batch stride: one batched GEMM whatever the threshold.
    bshd views do not: one GEMM per batch element (per_element: the threshold at 0), or the
    copying path (the default at these small sizes, and copies: the threshold out of reach)."""
    calls = []
    real_bmm = torch.bmm

    def bmm(a, b, **kw):
        calls.append(a.shape[0])
        return real_bmm(a, b, **kw)

    case = replace(BASE, layout=f"{fmt}_{fmt}_{fmt}", b=4, mask_type="padding_causal")
    if way == "per_element":
        monkeypatch.setattr(_eager, "_LOOP_MACS", 0)
    elif way == "copies":
        monkeypatch.setattr(_eager, "_LOOP_MACS", 1 << 62)
    monkeypatch.setattr(torch, "bmm", bmm)
    core = _results(case)
    monkeypatch.undo()
    if fmt == "sbhd":
        assert calls and set(calls) == {case.b * case.h}, calls
    elif way == "per_element":
        assert len(calls) == 6 * case.b and set(calls) == {case.h}, calls  # 2 fwd + 4 bwd GEMMs
    else:
        assert not calls, "the copying path called torch.bmm on the strided views"
    _ops_path(monkeypatch)
    _assert_same(core, _results(case))


@pytest.mark.parametrize("chunked", ["heads"], indirect=True)
@pytest.mark.parametrize(
    "change",
    [dict(dtype="fp32"), dict(bias_type="post_scale_bias", bias_shape="1hss"),
     dict(softmax_type="off-by-one"), dict(return_max_logit=True)],
    ids=["fp32", "bias", "sink", "max_logit"],
)  # fmt: skip
def test_core_only_where_it_applies(change, chunked):
    """fp32 (fp64 GEMMs), biases, sink softmax and max_logit keep the ops path."""
    _results(replace(BASE, **change))
    assert not chunked


@pytest.mark.parametrize("chunked", ["heads"], indirect=True)
def test_core_not_with_dropout_in_training(chunked):
    q, k, v = (torch.randn(19, 3, 4, 16, dtype=torch.bfloat16) for _ in range(3))
    module = te_fast.UnfusedDotProductAttention(0.25, attention_dropout=0.1)
    module(q, k, v, qkv_layout="sbhd_sbhd_sbhd")
    assert not chunked
    module.eval()  # dropout off: the core
    out = module(q, k, v, qkv_layout="sbhd_sbhd_sbhd")
    assert len(chunked) == 1 and out.shape == (19, 3, 64)
    with torch.no_grad():  # inference: the core as well (P is freed slice by slice)
        out = te_fast.UnfusedDotProductAttention(0.25)(q, k, v, qkv_layout="sbhd_sbhd_sbhd")
    assert len(chunked) == 2 and not out.requires_grad


def test_core_grads_only_where_asked(monkeypatch):
    """Only q needs a gradient: the backward runs dP and dQ alone (not dV, dK), and q's equals
    the ops path's. b = 2 bshd views take one bmm per batch element: 2 GEMMs, 4 calls."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 19, 4, 16, generator=gen).bfloat16() for _ in range(3))
    q.requires_grad_()
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    module = UnfusedDotProductAttention(0.25)
    out = module(q, k, v, **kw)
    calls = []
    real_bmm = torch.bmm

    def bmm(a, b, **kwargs):
        calls.append(a.shape)
        return real_bmm(a, b, **kwargs)

    monkeypatch.setattr(torch, "bmm", bmm)
    (dq,) = torch.autograd.grad(out, q, torch.ones_like(out))
    monkeypatch.setattr(torch, "bmm", real_bmm)
    assert len(calls) == 4, calls
    module._core_plan = lambda *a: None
    out_ops = module(q, k, v, **kw)
    (dq_ops,) = torch.autograd.grad(out_ops, q, torch.ones_like(out_ops))
    assert torch.equal(out, out_ops) and torch.equal(dq, dq_ops)


def test_chunk_bounds():
    assert _eager.chunk_bounds(2, 2, 4, 4, 2, 512 << 20) is None  # fits one chunk
    # 16 x 32 x 2048 x 2048 bf16 = 4 GiB: 8 slices of 2 batch elements
    want = (0, [(2 * i, 2 * i + 2) for i in range(8)])
    assert _eager.chunk_bounds(16, 32, 2048, 2048, 2, 512 << 20) == want
    # one batch element: slices of heads
    axis, bounds = _eager.chunk_bounds(1, 8, 16384, 16384, 2, 512 << 20)
    assert axis == 1 and len(bounds) == 8 and all(hi - lo == 1 for lo, hi in bounds)


def test_score_chunk_bytes_default_and_checks(monkeypatch):
    assert UnfusedDotProductAttention(0.25).score_chunk_bytes == 256 << 20
    assert UnfusedDotProductAttention(0.25, score_chunk_bytes=1 << 20).score_chunk_bytes == 1 << 20
    assert UnfusedDotProductAttention(0.25, score_chunk_bytes=None).score_chunk_bytes is None
    for bad in (0, -1, 1.5, True, "1M"):
        with pytest.raises(ValueError, match="score_chunk_bytes"):
            UnfusedDotProductAttention(0.25, score_chunk_bytes=bad)
    calls = []
    monkeypatch.setattr(_eager, "core", lambda *a: calls.append(a))
    q, k, v = (torch.randn(19, 3, 4, 16, dtype=torch.bfloat16) for _ in range(3))
    try:
        UnfusedDotProductAttention(0.25)(q, k, v, qkv_layout="sbhd_sbhd_sbhd")
    except (TypeError, AttributeError):
        pass  # the spy returns None
    assert calls and calls[0][-1] == (0, [(0, 3)])  # the default: one slice at this size


def test_small_calls_keep_the_ops_path(monkeypatch):
    """Below core_min_score_bytes (64 MiB by default) a call is host-bound: the ops path."""
    monkeypatch.undo()
    assert UnfusedDotProductAttention.core_min_score_bytes == 64 << 20
    calls = []
    monkeypatch.setattr(_eager, "core", lambda *a: calls.append(a))
    q, k, v = (torch.randn(19, 3, 4, 16, dtype=torch.bfloat16) for _ in range(3))
    out = UnfusedDotProductAttention(0.25)(q, k, v, qkv_layout="sbhd_sbhd_sbhd")
    assert not calls and out.shape == (19, 3, 64)
    monkeypatch.setattr(UnfusedDotProductAttention, "core_min_score_bytes", 3 * 4 * 19 * 19 * 2)
    try:
        UnfusedDotProductAttention(0.25)(q, k, v, qkv_layout="sbhd_sbhd_sbhd")
    except (TypeError, AttributeError):
        pass  # the spy returns None
    assert len(calls) == 1  # at the threshold: the core
