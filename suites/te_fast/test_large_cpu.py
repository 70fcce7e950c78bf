"""Past 2^31 elements on the CPU: the CPU kernels' row offsets must be 64-bit too.

One softmax forward and backward on a bf16 tensor of 2^31 + 3 * 4096 elements (4 GiB each),
checked on the sampled rows (the first, those around element 2^31, the last) against te_ref
under SPEC §6. Only the sampled rows of x and dy are written: the rest is fresh, never-touched
memory that the kernel reads as whatever it holds (every row is independent). It runs in CI
(8.7 GiB resident and ~85 s on CI's two cores) and skips with a reason where the
machine has less memory available; the GPU cases are in test_large.py (`-m large`).
"""

from __future__ import annotations

import pytest
import torch

import te_ref
from te_conformance.reports import record
from te_conformance.suites.checks.numerics import K_BACKWARD, K_FORWARD, check_ratio
from te_conformance.suites.fuzz.checks import softmax_bwd_refs
from te_conformance.suites.op_cases import LARGE_SCALE, TWO31, GiB, sample_rows
from te_fast import ops as fast

NEED_GIB = 14  # x and y, then y, dy and dx (4 GiB each), plus the process


def _available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024 / GiB
    except (OSError, KeyError, ValueError):
        return 0.0  # unknown: do not risk the machine


def test_cpu_softmax_past_2_31():
    """scaled_softmax forward and backward on the CPU past 2^31 elements: sampled rows exact
    to SPEC §6 (a 32-bit row offset reads or writes another row there, or crashes)."""
    available = _available_gib()
    if available < NEED_GIB:
        pytest.skip(f"needs {NEED_GIB} GiB of available memory, the machine has {available:.1f}")
    sk = 4096
    rows = (TWO31 // sk) + 3
    record.case(impl="te_fast", layout="large:scaled_softmax", dtype="bfloat16", device="cpu",
                shapes={"x": [1, 1, rows, sk]})  # fmt: skip
    sampled = sample_rows(rows, sk)
    gen = torch.Generator().manual_seed(5)
    x = torch.empty(1, 1, rows, sk, dtype=torch.bfloat16)
    xs = torch.randn(len(sampled), sk, generator=gen) * 2
    x.view(rows, sk)[sampled] = xs.to(torch.bfloat16)
    y = fast.scaled_softmax(x, LARGE_SCALE)
    del x
    dy = torch.empty_like(y)
    dys = torch.randn(len(sampled), sk, generator=gen).to(torch.bfloat16)
    dy.view(rows, sk)[sampled] = dys
    dx = fast.scaled_softmax_bwd(dy, y, LARGE_SCALE)
    for n, row in enumerate(sampled):
        xr = xs[n].to(torch.bfloat16).view(1, 1, 1, sk)
        refs = {c: te_ref.scaled_softmax(xr, LARGE_SCALE, compute_dtype=c).view(sk)
                for c in (torch.float64, torch.bfloat16)}  # fmt: skip
        got = y.view(rows, sk)[row]
        check_ratio(f"y row {row}", got, refs[torch.float64], refs[torch.bfloat16], K_FORWARD)
        ref64, lp = softmax_bwd_refs(dys[n], got, LARGE_SCALE, torch.bfloat16)
        check_ratio(f"dx row {row}", dx.view(rows, sk)[row], ref64, lp, K_BACKWARD)
