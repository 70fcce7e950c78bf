"""Which CUDA kernels one forward+backward of the benchmark's small-shape stack launches.

    python tools/profile_stack.py [--layers 8]

For te_fast eager, te_fast under torch.compile (default mode: the kernels a CUDA graph would
replay) and the inductor-compiled composite: kernel count and GPU time per iteration, and the
top kernels. Answers "where does the GPU time of a replayed graph go".
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.cases import AttnShape
from benchmarks.module_bench import make_stack


def kernels(step, iters: int = 5) -> None:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in evs) / iters
    print(f"  {len(evs) / iters:.0f} kernels/iter, {total:.1f} us GPU/iter")
    agg: dict[str, list[float]] = {}
    for e in evs:
        agg.setdefault(e.name[:90], []).append(e.device_time)
    top = sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:14]
    for name, ts in top:
        print(f"    {len(ts) / iters:5.1f}x {sum(ts) / iters:8.1f} us  {name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", type=int, default=8)
    a = p.parse_args()
    shape = AttnShape(b=2, h=16, s=128, d=64)
    td = torch.bfloat16
    x = torch.randn(shape.b, shape.s, shape.h * shape.d, device="cuda", dtype=td).requires_grad_()
    do = torch.randn_like(x)
    for use_te, compiled in ((True, False), (True, True), (False, False), (False, True)):
        stack = make_stack(shape, a.layers, use_te, td, torch.device("cuda"))
        f = torch.compile(stack, fullgraph=True) if compiled else stack
        name = ("te_fast" if use_te else "composite") + (" compiled" if compiled else " eager")

        def step(f=f):
            out = f(x)
            out.backward(do)

        print(name)
        kernels(step)


if __name__ == "__main__":
    main()
