"""Where one forward+backward of the benchmark's small-shape stack spends its time.

    python tools/gpu/profile_stack.py [--layers 8] [--modes eager,default,reduce-overhead] [--host]

For te_fast and the composite in each mode (eager; torch.compile's default mode, whose kernels
are those a CUDA graph would replay; reduce-overhead, the CUDA graphs themselves), one step being
the benchmark's (benchmarks/module_bench.py: forward, then torch.autograd.grad of input and
weights):
- wall clock per step (median of blocks of steps, each ending in a synchronize), the two stacks
  of a mode timed in alternation;
- kernels and GPU time per step, and the top kernels (torch.profiler's CUDA activity; under
  reduce-overhead, the kernels the graphs replay);
- with --host, the host-side Python functions a step spends its time in (cProfile, own time per
  step, the top ones): dynamo's guards, the CUDA-graph trees' bookkeeping, the autograd engine,
  te_fast's argument handling. A step whose wall time is above its GPU time is host-bound, and
  this says on what.
Under reduce-overhead a skipped CUDA graph is reported (and the mode's figures mean nothing then).
On a machine without CUDA it runs the same steps on the CPU, to check the plumbing (no kernels,
reduce-overhead without graphs; --shape tiny keeps that quick).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import peers  # noqa: E402
from benchmarks.cases import AttnShape  # noqa: E402
from benchmarks.module_bench import make_stack, make_step  # noqa: E402
from benchmarks.timing import sync  # noqa: E402

MODES = ("eager", "default", "reduce-overhead")
SHAPES = {"small": AttnShape(b=2, h=16, s=128, d=64), "tiny": AttnShape(b=1, h=2, s=16, d=8)}


def wall_us(step, device: torch.device, block: int = 20) -> float:
    """Wall clock per step over one block of steps ending in a synchronize."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(block):
        step()
    sync(device)
    return (time.perf_counter() - t0) * 1e6 / block


def kernels(step, device: torch.device, iters: int = 5, top: int = 14) -> list[str]:
    """Lines: kernels and GPU time per step, then the top kernels by GPU time."""
    if device.type != "cuda":
        return ["  kernels: none on the CPU"]
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        sync(device)
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in evs) / iters
    lines = [f"  {len(evs) / iters:.0f} kernels/step, {total:.1f} us GPU/step"]
    agg: dict[str, list[float]] = {}
    for e in evs:
        agg.setdefault(e.name[:90], []).append(e.device_time)
    for name, ts in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"    {len(ts) / iters:5.1f}x {sum(ts) / iters:8.1f} us  {name}")
    return lines


def host(step, device: torch.device, iters: int = 200, top: int = 14) -> list[str]:
    """Lines: the Python functions with the most own time per step (cProfile)."""
    pr = cProfile.Profile()
    sync(device)
    pr.enable()
    for _ in range(iters):
        step()
    sync(device)
    pr.disable()
    stats = pstats.Stats(pr).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in stats.values()) * 1e6 / iters
    lines = [f"  host (cProfile, its own overhead included): {total:.0f} us/step in Python"]
    for (file, line, name), (_, calls, own, _, _) in rows:
        where = f"{file.rsplit('site-packages/', 1)[-1]}:{line}" if line else file
        lines.append(f"    {own * 1e6 / iters:7.1f} us {calls / iters:6.1f}x  {name}  {where}")
    return lines


def skipped_graphs() -> int:
    return peers.compile_counters()["cudagraph_skips"]


def build(use_te: bool, mode: str, shape: AttnShape, layers: int, dtype, device, x, do):
    """The step of one stack in one mode, compiled and warmed up."""
    stack = make_stack(shape, layers, use_te, dtype, device)
    f = stack if mode == "eager" else torch.compile(stack, fullgraph=True, mode=mode)
    compiled_mode = mode if mode != "eager" else None
    step = make_step(f, (x,), (x, *stack.parameters()), do, compiled_mode)
    for _ in range(5):
        step()
    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    p.add_argument("--host", action="store_true", help="also the host-side Python (cProfile)")
    p.add_argument("--rounds", type=int, default=10, help="wall-clock blocks per stack")
    p.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="small",
        help="small: the benchmark's b2 h16 s128 d64; tiny: b1 h2 s16 d8 (a quick CPU check)",
    )
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        p.error(f"--modes takes some of {', '.join(MODES)}, got {a.modes!r}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = SHAPES[a.shape]
    dtype = torch.bfloat16
    x = torch.randn(shape.b, shape.s, shape.h * shape.d, device=device, dtype=dtype)
    x.requires_grad_()
    do = torch.randn_like(x)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (plumbing only)"
    print(f"{a.layers}x Linear+attn {shape} bf16, {where}, torch {torch.__version__}")
    for mode in modes:
        peers.reset_compile_state()
        before = skipped_graphs()
        steps = {
            name: build(use_te, mode, shape, a.layers, dtype, device, x, do)
            for name, use_te in (("te_fast", True), ("composite", False))
        }
        skipped = skipped_graphs() - before
        walls: dict[str, list[float]] = {name: [] for name in steps}
        for r in range(a.rounds):  # alternating, so that machine noise hits both alike
            for name in steps if r % 2 == 0 else reversed(list(steps)):
                walls[name].append(wall_us(steps[name], device))
        for name, step in steps.items():
            print(f"{name} {mode}: {statistics.median(walls[name]):.1f} us wall/step")
            print("\n".join(kernels(step, device)))
            if a.host:
                print("\n".join(host(step, device)))
        if mode == "reduce-overhead" and device.type == "cuda" and skipped:
            print(f"  !!! {skipped} CUDA graph(s) skipped: these are not CUDA-graph replays")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
