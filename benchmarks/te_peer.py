"""The `te` softmax peer: Transformer Engine's own fused softmax kernels (adapters/te_kernels).

One forward and one backward row per te_fast softmax op, for the dtypes and row lengths TE runs
(fp16/bf16, sk <= 16384); every other case is a skip row with TE's reason, and one skip row per
case says why when the library is not built; a --misaligned run has no te rows. The
upper-triangular op runs on TE's square [attn_batches, sk, sk] view of the case's bytes (TE
requires sq == sk).
"""

from __future__ import annotations

import torch

from benchmarks.cases import SCALE, SOFTMAX_OPS, SoftmaxOp
from benchmarks.ops_bench import SoftmaxCase, check_bwd, check_fwd
from benchmarks.runner import Runner, base_row
from benchmarks.timing import time_calls


def _te():
    from suites.adapters import te_kernels

    return te_kernels


def te_view(c: SoftmaxCase, op: SoftmaxOp, t: torch.Tensor) -> torch.Tensor | None:
    """t (b, h, sq, sk) as TE's op takes it, or None where the bytes make no square view."""
    if op.rank == 4:
        return t
    n, sk = t.numel(), c.sk
    return t.reshape(n // (sk * sk), sk, sk) if n % (sk * sk) == 0 else None


def _as4(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 4 else t.unsqueeze(0)  # (1, ab, s, s): the checks read rows alike


def run_case(r: Runner, c: SoftmaxCase) -> None:
    """TE's forward then backward of every op on case c."""
    if c.misaligned:  # no rows: TE's kernels load 4 elements at once, a misaligned row faults
        return
    te = _te()
    reason = te.unavailable_reason()
    if reason:
        r.skip(base_row("softmax", "te", dtype=c.dtype, sk=c.sk), reason)
        return
    for op in SOFTMAX_OPS:
        ys = fwd(r, c, op, te)
        if ys is not None:
            bwd(r, c, op, te, *ys)


def fwd(r: Runner, c: SoftmaxCase, op: SoftmaxOp, te):
    row = c.row(f"{op.fwd}_fwd", "te")
    x = te_view(c, op, c.x)
    mask = c.mask if op.masking == "mask" else None
    if x is None:
        r.skip(row, f"TE requires sq == sk: {c.shape} makes no [attn_batches, sk, sk] view")
        return None
    reasons = te.not_supported_reasons(
        op.name, tuple(x.shape), x.dtype, None if mask is None else tuple(mask.shape)
    )
    if reasons:
        r.skip(row, "; ".join(reasons))
        return None
    row["shape"] = "[" + ",".join(str(s) for s in x.shape) + "]"
    args = (x, mask, SCALE) if mask is not None else (x, SCALE)
    y = None
    with r.guard(row):
        y = te.forward(op.name, *args)
        chk = check_fwd(_as4(y), _as4(x), mask, op.masking, SCALE)
        stats = time_calls(lambda: te.forward(op.name, *args), r.device, r.plan.reps, r.plan.warmup)
        extra = mask.nbytes if mask is not None else 0
        r.bandwidth(row, stats, 2 * x.nbytes + extra, chk)
    return None if y is None else (x, y)


def bwd(r: Runner, c: SoftmaxCase, op: SoftmaxOp, te, x: torch.Tensor, y: torch.Tensor) -> None:
    row = c.row(op.bwd, "te")
    row["shape"] = "[" + ",".join(str(s) for s in x.shape) + "]"
    dy = c.dy.reshape(y.shape)
    with r.guard(row):
        dx = te.backward(op.name, dy, y, SCALE)
        chk = check_bwd(_as4(dx), _as4(dy), _as4(y), SCALE)
        del dx
        stats = time_calls(
            lambda: te.backward(op.name, dy, y, SCALE), r.device, r.plan.reps, r.plan.warmup
        )
        r.bandwidth(row, stats, 3 * x.nbytes, chk)
