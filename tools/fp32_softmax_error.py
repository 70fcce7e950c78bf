"""Where te_fast's fp32 softmax error comes from: SPEC §6 ratios over many seeds.

For each row length, 40 seeds of x ~ N(0, 2) and dy ~ N(0, 1) of shape [1, 3, 5, sk] at scale 0.6:
the ratio max|impl - ref64| / (k * max|ref_fp32 - ref64| + floor) of
  y             te_fast's forward (k = 2);
  dx_kernel     te_fast's backward from te_fast's y (k = 3);
  dx_float      the backward formula in fp32 (dot rounded to fp32 before dy - dot), same y;
  dx_double     the backward formula in float64, rounded once, same y;
  dx_exact_y    the float64 formula from the correctly rounded y: the floor any fp32 y allows.
Prints the median and worst ratio of each and how many seeds exceed 1. The fp32 composite
(te_ref at compute_dtype=float32) is the same-precision reference, as in the suites.

    python tools/fp32_softmax_error.py [cpu|cuda] [seeds]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import te_ref  # noqa: E402
from te_conformance.suites.checks.numerics import floor  # noqa: E402
from te_conformance.suites.fuzz.checks import softmax_bwd_refs  # noqa: E402
from te_fast import ops as fast  # noqa: E402

SCALE = 0.6


def _ratio(a, r64, lp, k):
    bound = k * float((lp.double() - r64).abs().max()) + floor(torch.float32)
    return float((a.detach().double() - r64).abs().max()) / bound


def _backward64(dy, y):
    """scale * y * (dy - sum(dy * y)) in float64 (the suites' softmax_bwd_refs), rounded once."""
    return softmax_bwd_refs(dy, y, SCALE, torch.float32)[0].float()


def main(device: str, seeds: int = 40, lengths=(13, 100, 1000, 4096)) -> dict:
    """Prints one line per row length; returns {sk: {name: [ratio per seed]}}."""
    table = {}
    for sk in lengths:
        ratios: dict[str, list[float]] = {}
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(seed)
            x = (torch.randn(1, 3, 5, sk, generator=gen) * 2).to(device)
            dy = torch.randn(1, 3, 5, sk, generator=gen).to(device)
            refs = {}
            for compute in (torch.float64, torch.float32):
                xr = x.to(compute).requires_grad_()
                yr = te_ref.scaled_softmax(xr, SCALE, compute_dtype=compute)
                yr.backward(dy.to(compute))
                refs[compute] = (yr.detach(), xr.grad)
            (y64, dx64), (y32, dx32) = refs[torch.float64], refs[torch.float32]
            y = fast.scaled_softmax(x, SCALE)
            dot32 = (dy * y).double().sum(-1, keepdim=True).float()
            dx_float = (torch.tensor(SCALE, device=device) * y) * (dy - dot32)
            got = {
                "y": (y, y64, y32, 2),
                "dx_kernel": (fast.scaled_softmax_bwd(dy, y, SCALE), dx64, dx32, 3),
                "dx_float": (dx_float, dx64, dx32, 3),
                "dx_double": (_backward64(dy, y), dx64, dx32, 3),
                "dx_exact_y": (_backward64(dy, y64.float()), dx64, dx32, 3),
            }
            for name, (a, r64, lp, k) in got.items():
                ratios.setdefault(name, []).append(_ratio(a, r64, lp, k))
        cells = []
        for name, v in ratios.items():
            over = sum(r > 1 for r in v)
            cells.append(f"{name} med {torch.tensor(v).median():.3f} max {max(v):.3f} >1: {over}")
        print(f"{device} sk{sk}: " + " | ".join(cells), flush=True)
        table[sk] = ratios
    return table


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu", int(sys.argv[2]) if len(sys.argv) > 2 else 40)
