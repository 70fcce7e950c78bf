"""The `te` softmax peer: Transformer Engine's own fused softmax kernels (adapters/te_kernels).

One forward and one backward row per te_fast softmax op of the case, on the very tensors te_fast
runs on, for the dtypes and shapes TE runs (fp16/bf16, sk <= 16384; the upper-triangular op only
where sq == sk: the square cases, ops_bench.run_square); every other case is a skip row with
TE's reason, and one skip row per case says why when the library is not built; a --misaligned
run has no te rows. Bytes are counted as for te_fast's rows (softmax_case.SoftmaxCase.traffic).
"""

from __future__ import annotations

import torch

from benchmarks.cases import SCALE, SoftmaxOp
from benchmarks.checks import check_bwd, check_fwd
from benchmarks.runner import Runner
from benchmarks.softmax_case import SoftmaxCase
from benchmarks.timing import time_calls


def _te():
    from te_conformance.suites.adapters import te_kernels

    return te_kernels


def run_case(r: Runner, c: SoftmaxCase, ops: tuple[SoftmaxOp, ...]) -> None:
    """TE's forward then backward of each of ops on case c."""
    if c.misaligned:  # no rows: TE's kernels load 4 elements at once, a misaligned row faults
        return
    te = _te()
    reason = te.unavailable_reason()
    if reason:
        r.skip(c.row(None, "te"), reason)
        return
    for op in ops:
        y = fwd(r, c, op, te)
        if y is not None:
            bwd(r, c, op, te, y)


def fwd(r: Runner, c: SoftmaxCase, op: SoftmaxOp, te) -> torch.Tensor | None:
    """TE's forward on te_fast's input (c.x_for(op)); its output, or None (skipped, failed)."""
    row = c.row(f"{op.fwd}_fwd", "te")
    x = c.x_for(op)
    mask = c.mask if op.masking == "mask" else None
    shape = tuple(x.shape)
    reasons = te.not_supported_reasons(
        op.name, shape, x.dtype, None if mask is None else tuple(mask.shape)
    )
    reasons += te.fault_reasons(op.name, shape)
    if reasons:
        r.skip(row, "; ".join(reasons))
        return None
    args = (x, mask, SCALE) if mask is not None else (x, SCALE)
    y = None
    with r.guard(row):
        y = te.forward(op.name, *args)
        chk = check_fwd(c.as4(y), c.x, mask, op.masking, SCALE)
        stats = time_calls(lambda: te.forward(op.name, *args), r.device, r.plan.reps, r.plan.warmup)
        r.op_bandwidth(row, stats, c.traffic(op.masking, "fwd"), chk)
    return y


def bwd(r: Runner, c: SoftmaxCase, op: SoftmaxOp, te, y: torch.Tensor) -> None:
    row = c.row(op.bwd, "te")
    dy = c.dy.view(y.shape)
    with r.guard(row):
        dx = te.backward(op.name, dy, y, SCALE)
        chk = check_bwd(c.as4(dx), c.dy, c.as4(y), SCALE)
        del dx
        stats = time_calls(
            lambda: te.backward(op.name, dy, y, SCALE), r.device, r.plan.reps, r.plan.warmup
        )
        r.op_bandwidth(row, stats, c.traffic(op.masking, "bwd"), chk)
