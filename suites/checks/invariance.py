"""Determinism and batch invariance of the softmax ops: the checks, shared by
suites/conformance/test_determinism.py and the self-tests that feed them broken stand-ins.

Determinism: the same call gives the same bytes every time (RUNS runs). Batch invariance: a row
gives the same bytes whether computed alone, in a batch of one (a fresh tensor or a slice of a
large batch), or inside a small or a large batch at any position; forward and backward. On CUDA
the large batch is large enough that the persistent grids walk several rows per CTA and the
row's position changes which CTA, lane group and grid-stride step computes it.
"""

from __future__ import annotations

import torch

from te_conformance.suites.adapters import ADAPTERS
from te_conformance.suites.cases import AttnCase, make_inputs
from te_conformance.suites.checks.attention import run_impl
from te_conformance.suites.checks.numerics import assert_bitwise_equal
from te_conformance.suites.fuzz.checks import OpImpl, te_fast_op
from te_conformance.suites.op_cases import OP_DTYPES, SOFTMAX_OPS

RUNS = 10
# Row lengths that take every kernel path (csrc/cuda/softmax_impl.cuh): rows shared by a warp's
# lanes, one CTA, clusters of 2, 4 and 8 CTAs, the two-pass kernel past 128K columns; 16-byte and
# one-element accesses (odd lengths). The CPU has one path; a few lengths suffice there.
PATH_LENGTHS = {
    "cpu": (1, 7, 32, 100, 1000, 1025, 4099),
    "cuda": (1, 7, 16, 17, 32, 40, 100, 128, 256, 1000, 1023, 1024, 1025, 4096, 4099, 16384,
             20000, 33000, 70000, 131072, 131080, 140000),
}  # fmt: skip
# Elements of the large batch: on CUDA several waves of every persistent grid.
LARGE_ELEMENTS = {"cpu": 1 << 15, "cuda": 1 << 24}
H, SQ = 2, 3  # heads and query rows of one batch element
SCALE = 0.7


def _shape(op: str, b: int, sk: int) -> tuple[int, ...]:
    return (b, SQ, sk) if SOFTMAX_OPS[op].rank == 3 else (b, H, SQ, sk)


def _forward_args(op: str, x: torch.Tensor, mask: torch.Tensor | None) -> tuple:
    return (x, mask, SCALE) if SOFTMAX_OPS[op].masked else (x, SCALE)


def large_batch(device: str, sk: int) -> int:
    return max(8, LARGE_ELEMENTS[device] // (H * SQ * sk))


def check_determinism(op: str, dtype_name: str, device: str, sk: int,
                      impl: OpImpl = te_fast_op) -> None:  # fmt: skip
    """RUNS forward calls, then RUNS backward calls on the same inputs: identical bytes."""
    dev = torch.device(device)
    dtype = OP_DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(sk)
    b = max(1, large_batch(device, sk) // 4)
    shape = _shape(op, b, sk)
    x = (torch.randn(shape, generator=gen) * 3).to(device=dev, dtype=dtype)
    mask = (torch.rand(b, 1, SQ, sk, generator=gen) < 0.3).to(dev)
    dy = torch.randn(shape, generator=gen).to(device=dev, dtype=dtype)
    fwd, bwd = f"{op}_fwd", f"{op}_bwd"
    args = _forward_args(op, x, mask)
    y = impl(fwd, *args)
    for run in range(1, RUNS):
        assert_bitwise_equal(f"{fwd} sk={sk}: run {run} vs run 0", impl(fwd, *args), y)
    dx = impl(bwd, dy, y, SCALE)
    for run in range(1, RUNS):
        assert_bitwise_equal(f"{bwd} sk={sk}: run {run} vs run 0", impl(bwd, dy, y, SCALE), dx)


def check_batch_invariance(
    op: str, dtype_name: str, device: str, sk: int, impl: OpImpl = te_fast_op,
    mask_kind: str = "batch",
) -> None:  # fmt: skip
    """One batch element (the probe) computed: as a batch of one; placed at the first, second,
    middle and last positions of a small (3) and a large batch (among random elements); as a
    slice of the large batch; each of its rows alone where the op has no row position (the plain
    and explicitly masked ones, forward and backward: a causal op's row i keeps a prefix that
    depends on i, in its backward too, SPEC §3). Forward and backward: identical bytes.
    mask_kind: "batch" (a mask per batch element) or "bcast" (one [1, 1, sq, sk] mask)."""
    dev = torch.device(device)
    dtype = OP_DTYPES[dtype_name]
    spec = SOFTMAX_OPS[op]
    gen = torch.Generator().manual_seed(1000 + sk)
    fwd, bwd = f"{op}_fwd", f"{op}_bwd"

    def rand(*shape):
        return (torch.randn(shape, generator=gen) * 3).to(device=dev, dtype=dtype)

    def mask_of(b):
        m = torch.rand(b if mask_kind == "batch" else 1, 1, SQ, sk, generator=gen) < 0.3
        m[..., 1, :] = True  # a fully masked row
        return m.to(dev)

    probe_x, probe_dy = rand(*_shape(op, 1, sk)), rand(*_shape(op, 1, sk))
    probe_mask = mask_of(1)
    y1 = impl(fwd, *_forward_args(op, probe_x, probe_mask))
    dx1 = impl(bwd, probe_dy, y1, SCALE)
    where = f"{fwd} sk={sk}"

    for b in (3, large_batch(device, sk)):
        positions = sorted({0, 1, b // 2, b - 1})
        x, dy = rand(*_shape(op, b, sk)), rand(*_shape(op, b, sk))
        mask = mask_of(b) if mask_kind == "batch" else probe_mask
        y_in = torch.empty_like(x)
        for p in positions:
            x[p], dy[p] = probe_x[0], probe_dy[0]
            if mask_kind == "batch":
                mask[p] = probe_mask[0]
        y = impl(fwd, *_forward_args(op, x, mask))
        y_in.copy_(y)
        for p in positions:
            y_in[p] = y1[0]  # the backward's probe sees the probe's own forward output
        dx = impl(bwd, dy, y_in, SCALE)
        for p in positions:
            assert_bitwise_equal(f"{where}: position {p} of a batch of {b} vs alone", y[p], y1[0])
            assert_bitwise_equal(
                f"{bwd} sk={sk}: position {p} of a batch of {b} vs alone", dx[p], dx1[0]
            )
        p = positions[-1]  # a slice of the batch (a view at an offset): a batch of one again
        m_slice = mask[p : p + 1] if mask_kind == "batch" else mask
        assert_bitwise_equal(
            f"{where}: slice [{p}:{p + 1}] of a batch of {b}",
            impl(fwd, *_forward_args(op, x[p : p + 1], m_slice)), y1,
        )  # fmt: skip

    # each row alone, as a fresh [1, 1, 1, sk] tensor (rank 3: [1, 1, sk])
    rows = [(0, 0), (0, SQ - 1), (H - 1, 1)] if spec.rank == 4 else [(None, 0), (None, SQ - 1)]
    for hi, i in rows:
        sel = (0, hi, i) if spec.rank == 4 else (0, i)
        alone_shape = (1, 1, 1, sk) if spec.rank == 4 else (1, 1, sk)
        if op not in ("scaled_softmax", "scaled_masked_softmax"):
            continue  # a row position: the row alone would be row 0 of its own
        xr = probe_x[sel].reshape(alone_shape).clone()
        mr = probe_mask[0, 0, i].reshape(1, 1, 1, sk).clone()
        yr = impl(fwd, *_forward_args(op, xr, mr))
        assert_bitwise_equal(f"{where}: row {sel} alone", yr.reshape(sk), y1[sel])
        dyr = probe_dy[sel].reshape(alone_shape).clone()
        yr1 = y1[sel].reshape(alone_shape).clone()
        dxr = impl(bwd, dyr, yr1, SCALE)
        assert_bitwise_equal(f"{bwd} sk={sk}: row {sel} alone", dxr.reshape(sk), dx1[sel])


# ----------------------------------------------------------------------------- the module


def module_runs(case: AttnCase, device, runs: int, dropout: float = 0.0, seed: int | None = None,
                adapter=None) -> list:  # fmt: skip
    """(out, max_logit, grads) of ``runs`` forward+backward calls on the same inputs and module
    (training mode); with ``seed``, torch.manual_seed(seed) before each."""
    adapter = adapter or ADAPTERS["te_fast"]
    inputs = make_inputs(case, device, torch.Generator().manual_seed(7))
    module = adapter.build(case, case.d**-0.5, dropout=dropout).train()
    results = []
    for _ in range(runs):
        if seed is not None:
            torch.manual_seed(seed)
        results.append(run_impl(adapter, module, case, inputs))
    return results


def assert_same_results(name: str, a, b) -> None:
    """Output, max_logit and every gradient: identical bytes."""
    out_a, ml_a, grads_a = a
    out_b, ml_b, grads_b = b
    assert_bitwise_equal(f"{name}: out", out_a, out_b)
    if ml_a is not None:
        assert_bitwise_equal(f"{name}: max_logit", ml_a, ml_b)
    for leaf in grads_a:
        assert_bitwise_equal(f"{name}: d{leaf}", grads_a[leaf], grads_b[leaf])


def check_module_determinism(case: AttnCase, device, adapter=None) -> None:
    """RUNS forward+backward calls without dropout: identical bytes."""
    results = module_runs(case, device, RUNS, adapter=adapter)
    for run, r in enumerate(results[1:], 1):
        assert_same_results(f"run {run} vs run 0", r, results[0])


def check_dropout_seeded(case: AttnCase, device, p: float = 0.2, adapter=None) -> None:
    """With dropout p, torch.manual_seed(1234) before each of RUNS calls: identical bytes; another
    seed: another output."""
    results = module_runs(case, device, RUNS, dropout=p, seed=1234, adapter=adapter)
    for run, r in enumerate(results[1:], 1):
        assert_same_results(f"seed 1234, run {run} vs run 0", r, results[0])
    other = module_runs(case, device, 1, dropout=p, seed=4321, adapter=adapter)[0]
    assert not torch.equal(other[0], results[0][0]), "another seed gave the same dropout mask"
