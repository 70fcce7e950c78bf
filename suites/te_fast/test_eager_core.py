"""te_fast's eager core (te_fast/_attention_core.py): plain eager fp16/bf16 calls with at least
64 MiB of scores run BMM1 -> softmax -> BMM2 and the backward as one autograd node on the strided
inputs, slice by slice along the batch or head axis (UnfusedDotProductAttention(
score_chunk_bytes=...), 256 MiB by default), so that only one slice's scores (forward) or dP and
dS (backward) sit beside P. The suites' shapes are below that size (the ops path; the module
benchmark and test_large's THD module case run the core): here the size threshold is 0 and the
slice size is set on the class (so for every module the adapter builds) small enough that every
mask kernel, GQA, both layout families and
both split axes go through several slices, judged against te_ref under SPEC §6 (with the
no-alias and no-mutation checks); on the CPU one slice and the path that records torch.matmul and
the softmax op separately are judged the same way on the same inputs, and so is each way
_matmul_into can run a GEMM (one folded batched GEMM, one per batch element, via copies). Not bit
for bit: the GEMMs are torch's, and its CPU kernels may block a slice's GEMM differently from the
whole batch's (on an AVX2-only CPU a bf16 dq element of the sliced core differed by 1.2e-4 from
one slice's), so the same bits across slicings hold on no CPU by construction.

Traces run the core as the ops te_fast::attention_core and attention_core_backward: opcheck on
both (every softmax kind, both split axes, fp16/bf16/fp32), torch.compile(fullgraph=True) with
aot_eager and inductor (static and dynamic=True) bit for bit against the eager core, with the
core's ops counted in the captured graphs (a trace that fell back to the whole-tensor ops
fails), P saved per slice and never recomputed, no P kept under no_grad; functorch transforms
keep the ops path; double backward raises; on a GPU, reduce-overhead replays CUDA graphs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

te_fast = pytest.importorskip("te_fast")
if te_fast.UNAVAILABLE_REASON is not None:
    pytest.skip(f"te_fast unavailable: {te_fast.UNAVAILABLE_REASON}", allow_module_level=True)

from te_conformance.suites.adapters import ADAPTERS  # noqa: E402
from te_conformance.suites.cases import DTYPES, AttnCase, make_inputs  # noqa: E402
from te_conformance.suites.checks import contracts  # noqa: E402
from te_conformance.suites.checks.attention import judge_against_reference, run_impl  # noqa: E402
from te_conformance.suites.devices import device_params, require  # noqa: E402
from te_conformance.suites.fuzz.checks import ModuleExample, check_module_example  # noqa: E402
from te_conformance.suites.op_cases import CAUSAL_OPS  # noqa: E402
from te_fast import _attention_core  # noqa: E402
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
    real = _attention_core.core

    def spy(*args, **kwargs):
        calls.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(UnfusedDotProductAttention, "score_chunk_bytes", SPLITS[request.param])
    monkeypatch.setattr(_attention_core, "core", spy)
    return calls


@pytest.fixture
def chunk(monkeypatch, request):
    """Force the chunk size, without a spy (a traced spy's list would guard every compile)."""
    monkeypatch.setattr(UnfusedDotProductAttention, "score_chunk_bytes", SPLITS[request.param])
    return SPLITS[request.param]


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


def _judged(case, seed=0):
    """One forward and backward of te_fast's module on the case, judged against te_ref under
    SPEC §6 (the sliced core, one slice and the ops path each: their GEMMs are torch's, whose
    CPU kernels may block a slice's GEMM differently from the whole's by instruction set, so
    nothing promises the same bits across slicings: docs/checks.md)."""
    dev = torch.device(case.device)
    inputs = make_inputs(case, dev, torch.Generator().manual_seed(seed))
    module = ADAPTERS["te_fast"].build(case, case.d**-0.5)
    judge_against_reference(case, inputs, run_impl(ADAPTERS["te_fast"], module, case, inputs))


@pytest.mark.parametrize("chunked", list(SPLITS), indirect=True)
@pytest.mark.parametrize("name", list(CASES))
def test_core_one_slice_and_the_ops_path_on_cpu(name, chunked, monkeypatch):
    """The sliced core, the core in one slice (score_chunk_bytes None) and the ops path each
    meet SPEC §6 on the same inputs, each taking the path it should."""
    case = CASES[name]
    _judged(case)
    assert chunked, "the core did not run"
    monkeypatch.setattr(UnfusedDotProductAttention, "score_chunk_bytes", None)
    _judged(case)
    assert len(chunked) == 2 and chunked[1] == (0, [(0, case.b)]), "None: one slice"
    _ops_path(monkeypatch)
    _judged(case)
    assert len(chunked) == 2, "the ops path took the core"


@pytest.mark.parametrize("way", ["default", "per_element", "copies"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_core_gemm_ways_on_cpu(way, fmt, monkeypatch):
    """sbhd views fold (b, h) into one batch stride: one batched GEMM whatever the threshold.
    bshd views do not: one GEMM per batch element (per_element: the threshold at 0), or the
    copying path (the default at these small sizes, and copies: the threshold out of reach).
    Each way, and the ops path, meets SPEC §6 on the same inputs."""
    calls = []
    real_bmm = torch.bmm

    def bmm(a, b, **kw):
        calls.append(a.shape[0])
        return real_bmm(a, b, **kw)

    case = replace(BASE, layout=f"{fmt}_{fmt}_{fmt}", b=4, mask_type="padding_causal")
    if way == "per_element":
        monkeypatch.setattr(_attention_core, "_LOOP_MACS", 0)
    elif way == "copies":
        monkeypatch.setattr(_attention_core, "_LOOP_MACS", 1 << 62)
    monkeypatch.setattr(torch, "bmm", bmm)
    _judged(case)
    monkeypatch.undo()
    if fmt == "sbhd":
        assert calls and set(calls) == {case.b * case.h}, calls
    elif way == "per_element":
        assert len(calls) == 6 * case.b and set(calls) == {case.h}, calls  # 2 fwd + 4 bwd GEMMs
    else:
        assert not calls, "the copying path called torch.bmm on the strided views"
    _ops_path(monkeypatch)
    _judged(case)


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
    assert _attention_core.chunk_bounds(2, 2, 4, 4, 2, 512 << 20) is None  # fits one chunk
    # 16 x 32 x 2048 x 2048 bf16 = 4 GiB: 8 slices of 2 batch elements
    want = (0, [(2 * i, 2 * i + 2) for i in range(8)])
    assert _attention_core.chunk_bounds(16, 32, 2048, 2048, 2, 512 << 20) == want
    # one batch element: slices of heads
    axis, bounds = _attention_core.chunk_bounds(1, 8, 16384, 16384, 2, 512 << 20)
    assert axis == 1 and len(bounds) == 8 and all(hi - lo == 1 for lo, hi in bounds)


def test_score_chunk_bytes_default_and_checks(monkeypatch):
    assert UnfusedDotProductAttention(0.25).score_chunk_bytes == 256 << 20
    assert UnfusedDotProductAttention(0.25, score_chunk_bytes=1 << 20).score_chunk_bytes == 1 << 20
    assert UnfusedDotProductAttention(0.25, score_chunk_bytes=None).score_chunk_bytes is None
    for bad in (0, -1, 1.5, True, "1M"):
        with pytest.raises(ValueError, match="score_chunk_bytes"):
            UnfusedDotProductAttention(0.25, score_chunk_bytes=bad)
    calls = []
    monkeypatch.setattr(_attention_core, "core", lambda *a: calls.append(a))
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
    monkeypatch.setattr(_attention_core, "core", lambda *a: calls.append(a))
    q, k, v = (torch.randn(19, 3, 4, 16, dtype=torch.bfloat16) for _ in range(3))
    out = UnfusedDotProductAttention(0.25)(q, k, v, qkv_layout="sbhd_sbhd_sbhd")
    assert not calls and out.shape == (19, 3, 64)
    monkeypatch.setattr(UnfusedDotProductAttention, "core_min_score_bytes", 3 * 4 * 19 * 19 * 2)
    try:
        UnfusedDotProductAttention(0.25)(q, k, v, qkv_layout="sbhd_sbhd_sbhd")
    except (TypeError, AttributeError):
        pass  # the spy returns None
    assert len(calls) == 1  # at the threshold: the core


# ----------------------------------------------------------------------------- the core as ops
# Traces (torch.compile, export) run the core through te_fast::attention_core and
# attention_core_backward: the same functions, so compiled results equal the eager core's bit
# for bit on the CPU (the GEMMs and softmax rows run in the ops; the rest is views, the masks and
# the THD conversions, exact).

CORE_OP = "te_fast.attention_core.default"
CORE_BWD_OP = "te_fast.attention_core_backward.default"
# Softmax kind -> mask shape (None: no mask): a per-batch and a per-head masked case.
OP_KINDS = {
    "scaled_softmax": None,
    "scaled_masked_softmax-batch": (3, 1, 11, 13),
    "scaled_masked_softmax-head": (1, 4, 11, 13),
    "scaled_upper_triang_masked_softmax": None,
    "scaled_aligned_causal_masked_softmax": None,
}
OP_SPLITS = {"batch": (0, [0, 1, 3]), "heads": (1, [0, 1, 2, 4]), "one": (0, [0, 3])}


def _op_args(dtype, kind, split, requires_grad, seed=0):
    """attention_core's arguments: q/k/v as permuted views of bshd tensors (their strides are
    what o/dq/dk/dv copy: a fake that answered contiguous would fail opcheck), sq 11, skv 13."""
    gen = torch.Generator().manual_seed(seed)

    def heads_first(s, d):
        t = torch.randn(3, s, 4, d, generator=gen).to(DTYPES[dtype]).permute(0, 2, 1, 3)
        return t.requires_grad_(requires_grad)

    q, k, v = heads_first(11, 8), heads_first(13, 8), heads_first(13, 6)
    shape = OP_KINDS[kind]
    mask = None if shape is None else torch.rand(shape, generator=gen) > 0.6
    axis, edges = OP_SPLITS[split]
    return q, k, v, mask, kind.split("-")[0], 0.3, axis, edges


@pytest.mark.parametrize("split", list(OP_SPLITS))
@pytest.mark.parametrize("kind", list(OP_KINDS))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_core_op_opcheck(dtype, kind, split):
    """All four opcheck sub-tests of the forward op (through its autograd: the backward op)."""
    args = _op_args(dtype, kind, split, requires_grad=True)
    torch.library.opcheck(torch.ops.te_fast.attention_core.default, (*args, True))


@pytest.mark.parametrize("output_mask", [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_core_backward_op_opcheck(dtype, output_mask):
    """The backward op's opcheck; unneeded gradients are None, the others bit for bit those
    of a call that asks for all three (skipping dK or dV must not change dQ)."""
    args = _op_args(dtype, "scaled_masked_softmax-head", "heads", requires_grad=False)
    q, k, v, _, softmax, scale, axis, edges = args
    o, probs = torch.ops.te_fast.attention_core(*args, True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype)
    bwd_args = (do, q, k, v, probs, softmax, scale, axis, edges)
    mask = [bool(m) for m in output_mask]
    torch.library.opcheck(torch.ops.te_fast.attention_core_backward.default, (*bwd_args, mask))
    grads = te_fast.ops.attention_core_backward(*bwd_args, mask)
    every = te_fast.ops.attention_core_backward(*bwd_args, [True, True, True])
    for g, want, t, m in zip(grads, every, (q, k, v), mask):
        assert (g is not None) == m
        if m:
            assert torch.equal(g, want) and g.stride() == want.stride() != t.contiguous().stride()


class _OpLog(TorchDispatchMode):
    """The ops dispatched at the top level (not inside a te_fast op's kernel)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_core_op_equals_the_eager_core():
    """The op and _Core run the same functions: same output, probabilities and gradients. P is
    the backward's input, not a result: no gradient, and none of P's size filled with zeros
    for the backward either."""
    q, k, v, mask, kind, scale, axis, edges = _op_args("bf16", "scaled_masked_softmax-head",
                                                       "heads", requires_grad=True)  # fmt: skip
    o, probs = te_fast.ops.attention_core(q, k, v, mask, kind, scale, axis, edges, True)
    assert len(probs) == len(edges) - 1 and all(p.is_contiguous() for p in probs)
    laid_out = _attention_core._empty_like_layout(q, o.shape)
    assert o.stride() == laid_out.stride() != q.contiguous().stride()
    bounds = list(zip(edges[:-1], edges[1:]))
    o_eager = _attention_core._Core.apply(q, k, v, mask, kind, scale, axis, bounds)
    do = torch.randn_like(o)
    assert torch.equal(o, o_eager) and o.stride() == o_eager.stride()
    with _OpLog() as log:
        grads = torch.autograd.grad(o, (q, k, v), do)
    assert log.ops == [CORE_BWD_OP], log.ops
    for g, g_eager in zip(grads, torch.autograd.grad(o_eager, (q, k, v), do)):
        assert torch.equal(g, g_eager) and g.stride() == g_eager.stride()
    assert not any(p.requires_grad for p in probs)


@pytest.mark.parametrize("kind", list(OP_KINDS))
def test_core_backward_takes_the_kinds_backward(kind):
    """dS comes from the softmax kind's own backward op where the kind is causal (it reads only
    each row's kept prefix of dP and P, SPEC §3), from scaled_softmax_bwd otherwise (the explicitly
    masked backward takes no mask: the same formula over whole rows). The gradients themselves
    are judged by this file's other tests."""
    q, k, v, mask, name, scale, axis, edges = _op_args("bf16", kind, "heads", requires_grad=False)
    o, probs = te_fast.ops.attention_core(q, k, v, mask, name, scale, axis, edges, True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(2)).to(o.dtype)
    bounds = list(zip(edges[:-1], edges[1:]))
    with _OpLog() as log:
        _attention_core._core_backward(
            do, q, k, v, probs, name, scale, axis, bounds, (True, True, True)
        )  # fmt: skip
    want = f"te_fast.{name if name in CAUSAL_OPS else 'scaled_softmax'}_bwd.default"
    softmax_ops = sorted({op for op in log.ops if op.endswith("softmax_bwd.default")})
    assert softmax_ops == [want], log.ops


def test_core_op_errors():
    """Bad arguments, keep_probs=False with a gradient to take, and double backward (in the op
    and in the eager core) raise with a message."""
    q, k, v, mask, kind, scale, axis, edges = _op_args("bf16", "scaled_softmax", "batch",
                                                       requires_grad=True)  # fmt: skip
    op = torch.ops.te_fast.attention_core
    for bad, match in [
        (dict(kind="softmax"), "softmax to be one of"),
        (dict(mask=torch.zeros(3, 1, 11, 13, dtype=torch.bool)), "takes a mask with"),
        (dict(edges=[0, 2]), r"edges \[0, ..., q.shape\[axis\]\]"),
        (dict(edges=[0, 2, 2, 3]), "increasing edges"),
        (dict(axis=2, edges=[0, 11]), "axis 0 or 1"),
    ]:
        call = dict(mask=mask, kind=kind, axis=axis, edges=edges) | bad
        with pytest.raises(RuntimeError, match=match):
            op(q, k, v, call["mask"], call["kind"], scale, call["axis"], call["edges"], True)
    with pytest.raises(RuntimeError, match="keep_probs=True where q, k or v require grad"):
        op(q, k, v, mask, kind, scale, axis, edges, False)
    with torch.no_grad():  # nothing to differentiate: no probabilities kept
        assert op(q, k, v, mask, kind, scale, axis, edges, False)[1] == []
    o = op(q, k, v, mask, kind, scale, axis, edges, True)[0]
    (dq,) = torch.autograd.grad(o.float().square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        torch.autograd.grad(dq.float().sum(), q)
    bounds = list(zip(edges[:-1], edges[1:]))
    o = _attention_core._Core.apply(q, k, v, mask, kind, scale, axis, bounds)
    (dq,) = torch.autograd.grad(o.float().square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.float().sum().backward()


def _recording_aot_eager(graphs):
    """aot_eager (min-cut partitioner) keeping the forward and backward FX graphs it runs."""
    from torch._dynamo.backends.debugging import aot_eager, boxed_nop

    def record(kind):
        def compiler(gm, example_inputs):
            graphs.setdefault(kind, []).append(gm)
            return boxed_nop(gm, example_inputs)

        return compiler

    def backend(gm, example_inputs):
        return aot_eager(gm, example_inputs, fw_compiler=record("fw"), bw_compiler=record("bw"))

    return backend


def _recording(backend_name, graphs):
    """The named dynamo backend, keeping the graph dynamo hands it."""
    real = torch._dynamo.lookup_backend(backend_name)

    def backend(gm, example_inputs):
        graphs.setdefault("dynamo", []).append(gm)
        return real(gm, example_inputs)

    return backend


def _calls(gm):
    """The functions gm calls, those of its subgraphs (higher-order ops' bodies) included."""
    return [
        str(n.target)
        for m in gm.modules()
        if isinstance(m, torch.fx.GraphModule)
        for n in m.graph.nodes
        if n.op == "call_function"
    ]


def _the_graph(graphs):
    """The one graph that computes something (dynamo may also hand over an empty one)."""
    (gm,) = [gm for gm in graphs if _calls(gm)]
    return gm


def _assert_one_core(gm, op=CORE_OP):
    """gm calls ``op`` once and no softmax op of its own (the whole-tensor path calls those)."""
    calls = _calls(gm)
    assert calls.count(op) == 1, f"{op} called {calls.count(op)} times in the graph: {calls}"
    whole = [c for c in calls if c.startswith("te_fast.scaled_")]
    assert not whole, f"the trace took the whole-tensor path: {whole}"


def _compiled_vs_eager(case, backend, dynamic=None, lengths=None):
    """Compile the module (fullgraph) and run it over ``lengths`` (sq = skv; default: the case's
    own): every result, watched for mutation and aliasing, equals the eager core's bit for bit;
    no graph breaks. Returns the compile counters."""
    contracts.reset_compile_state()
    adapter = ADAPTERS["te_fast"]
    module = adapter.build(case, case.d**-0.5)
    compiled = torch.compile(module, backend=backend, fullgraph=True, dynamic=dynamic)
    for s in lengths or [None]:
        c = case if s is None else replace(case, sq=s, skv=s)
        inputs = make_inputs(c, torch.device(c.device), torch.Generator().manual_seed(s or 5))
        eager = run_impl(adapter, module, c, inputs)
        _assert_same(run_impl(adapter, compiled, c, inputs, watch=True), eager)
    contracts.assert_no_graph_breaks()
    return contracts.compile_counters()


COMPILED_CASES = ["causal", "causal_bottom_right-cross", "no_mask-gqa-fp16", "padding-sbhd",
                  "padding_causal_bottom_right-thd", "arbitrary-mqa"]  # fmt: skip


@pytest.mark.parametrize("chunk", list(SPLITS), indirect=True)
@pytest.mark.parametrize("name", COMPILED_CASES)
def test_compiled_core_aot_eager(name, chunk):
    """aot_eager, fullgraph: the eager core's results bit for bit; the forward graph calls the
    core op once, the backward graph the backward op once and never the forward again (no
    recomputation), with each slice's P saved as a tensor of its own (no copy into one)."""
    graphs = {}
    _compiled_vs_eager(CASES[name], _recording_aot_eager(graphs))
    fw, bw = _the_graph(graphs["fw"]), _the_graph(graphs["bw"])
    _assert_one_core(fw)
    _assert_one_core(bw, CORE_BWD_OP)
    assert CORE_OP not in _calls(bw), "the backward recomputes the forward"
    assert not {"aten.cat.default", "aten.stack.default"} & set(_calls(fw) + _calls(bw))
    (node,) = [n for n in bw.graph.nodes if str(n.target) == CORE_BWD_OP]
    probs, case = node.args[4], CASES[name]
    _, bounds = _attention_core.chunk_bounds(case.b, case.h, case.sq, case.skv, 2, chunk)
    assert len(probs) == len(bounds) > 1 and all(p.op == "placeholder" for p in probs)


@pytest.mark.parametrize("chunk", list(SPLITS), indirect=True)
@pytest.mark.parametrize("name", ["causal", "arbitrary-mqa"])
def test_compiled_core_inductor(name, chunk):
    """inductor, fullgraph: the core op in the trace, the eager core's results bit for bit."""
    graphs = {}
    _compiled_vs_eager(CASES[name], _recording("inductor", graphs))
    gm = _the_graph(graphs["dynamo"])
    _assert_one_core(gm)


@pytest.mark.parametrize("chunk", ["heads"], indirect=True)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_core_dynamic_shapes(backend, chunk):
    """dynamic=True over several lengths: one graph (the slice count, one per head here, is
    guarded; the edges are expressions of the sizes), the core op in it, results bit for bit."""
    graphs = {}
    case = replace(BASE, mask_type="padding_causal")
    stats = _compiled_vs_eager(case, _recording(backend, graphs), True, [19, 23, 30, 41])
    assert stats["unique_graphs"] == 1, stats
    gm = _the_graph(graphs["dynamo"])
    _assert_one_core(gm)
    assert any(isinstance(n.meta.get("example_value"), torch.SymInt) for n in gm.graph.nodes)


@pytest.mark.parametrize("chunk", ["batch"], indirect=True)
def test_compiled_core_dynamic_slice_counts(chunk):
    """dynamic=True where the lengths change the slice count (batch slices of a fixed size):
    correct each time, and no more graphs than slice counts."""
    lengths = [13, 19, 27, 33]
    plans = [_attention_core.chunk_bounds(3, 4, s, s, 2, chunk) for s in lengths]
    counts = {len((plan or (0, [0]))[1]) for plan in plans}
    assert len(counts) > 1
    graphs = {}
    stats = _compiled_vs_eager(BASE, _recording("aot_eager", graphs), True, lengths)
    assert 1 <= stats["unique_graphs"] <= len(counts), stats
    for gm in graphs["dynamo"]:
        if _calls(gm):
            _assert_one_core(gm)


@pytest.mark.parametrize("chunk", ["heads"], indirect=True)
def test_compiled_core_inference_keeps_no_probs(chunk):
    """Under no_grad the traced op keeps no probabilities (freed slice by slice, as in eager)."""
    graphs = {}
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(19, 3, 4, 16, generator=gen).bfloat16() for _ in range(3))
    module = UnfusedDotProductAttention(0.25)
    kw = dict(qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="causal")
    compiled = torch.compile(module, backend=_recording("aot_eager", graphs), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(q, k, v, **kw), module(q, k, v, **kw))
    gm = _the_graph(graphs["dynamo"])
    _assert_one_core(gm)
    (node,) = [n for n in gm.graph.nodes if str(n.target) == CORE_OP]
    assert node.args[-1] is False, node.args


@pytest.mark.parametrize("chunk", ["heads"], indirect=True)
def test_functorch_keeps_the_ops_path(chunk, monkeypatch):
    """vmap, eager or compiled (no rule for the core's ops, whose Tensor[] output the batched
    fallback cannot return), runs the whole-tensor ops as before: per example, the core's
    result, and no core op anywhere in the compiled graph."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 19, 3, 4, 16, generator=gen).bfloat16() for _ in range(3))
    module = UnfusedDotProductAttention(0.25)
    kw = dict(qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="causal")
    vmapped = torch.func.vmap(lambda q, k, v: module(q, k, v, **kw))
    out = vmapped(q, k, v)
    for i in range(2):  # (outside vmap: the core)
        assert torch.equal(out[i], module(q[i], k[i], v[i], **kw))
    contracts.reset_compile_state()
    graphs = {}
    compiled = torch.compile(vmapped, backend=_recording("aot_eager", graphs), fullgraph=True)
    assert torch.equal(compiled(q, k, v), out)
    calls = _calls(_the_graph(graphs["dynamo"]))
    assert CORE_OP not in calls and any(c.startswith("te_fast.scaled_") for c in calls), calls


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", list(SPLITS), indirect=True)
def test_compiled_core_replays_from_cuda_graphs(chunk, monkeypatch):
    """mode="reduce-overhead", fullgraph: the core's ops run (their kernels are counted in the
    warm-up, which runs them eagerly), forward and backward replayed from CUDA graphs (no
    skips), every iteration against te_ref (SPEC §6)."""
    require("cuda")
    ran = []
    for name in ("_core_forward", "_core_backward"):
        real = getattr(_attention_core, name)
        monkeypatch.setattr(
            _attention_core, name, lambda *a, real=real, name=name: (ran.append(name), real(*a))[1]
        )
    case = replace(BASE, device="cuda")
    adapter = ADAPTERS["te_fast"]
    contracts.reset_compile_state()
    module = adapter.build(case, case.d**-0.5)
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    base = make_inputs(case, torch.device("cuda"), torch.Generator().manual_seed(6))
    rng = torch.Generator().manual_seed(7)
    launches = 0
    for it in range(4):
        inputs = base.with_fresh_values(rng)
        result = {}

        def step(inputs=inputs, result=result):
            torch.compiler.cudagraph_mark_step_begin()
            result["out"] = run_impl(adapter, compiled, case, inputs, watch=True)

        if it == 3:
            launches = contracts.count_graph_launches(step)
        else:
            step()
        judge_against_reference(case, inputs, result["out"])
    assert {"_core_forward", "_core_backward"} <= set(ran), f"the core's ops did not run: {ran}"
    contracts.assert_no_graph_breaks()
    contracts.assert_no_cudagraph_skips()
    contracts.assert_graphs_replayed(launches)
