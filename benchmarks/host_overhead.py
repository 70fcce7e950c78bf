"""Host (CPU-side) overhead of UnfusedDotProductAttention forward+backward, te_fast vs composite.

    python -m benchmarks.host_overhead [--layers 8] [--rounds 40] [--dtype bf16 fp32]
    python -m benchmarks.host_overhead --device cuda --shape small --dtype bf16   (on a GPU)

Runs the benchmark's Layer stack (benchmarks/module_bench.py: a Linear producing bs3hd q/k/v, then
causal attention) on the CPU at a tiny shape (b1 h2 s16 d8), where the kernels cost next to
nothing and what is timed is Python, the dispatcher and autograd: the per-call cost that makes the
small shape launch-bound on a GPU. te_fast and the eager composite run interleaved, `block`
iterations at a time, so machine noise hits both alike. Time is the calling thread's CPU time
(torch runs single-threaded here, and the autograd engine runs CPU backward on the calling
thread), which other processes on a shared machine inflate far less than wall time. The figure
is the median over rounds of that time per layer forward+backward, in microseconds.

--instructions counts instead (valgrind's callgrind through torch.utils.benchmark): instructions
per layer forward+backward, deterministic to a fraction of a percent, so a before/after
comparison holds on a loaded machine where wall and CPU time do not. Takes minutes.

--device cuda --shape small is the GPU form of the benchmark's small-shape and stack targets
(te_fast eager at most the eager composite), decided by pairs: each round times te_fast and the
composite back to back (wall clock of `block` steps and one synchronize each), and the paired
ratio te_fast / composite of a round is reported as its median and quartiles over the rounds.
`python -m benchmarks` times each implementation in its own stretch, where the host-bound rows
swing by 20-50% from run to run on the H200 machine; a paired ratio's quartiles say whether a
difference is more than that.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.cases import DTYPES as ALL_DTYPES
from benchmarks.cases import AttnShape, Plan
from benchmarks.module_bench import make_stack

SHAPE = AttnShape(b=1, h=2, s=16, d=8)
SMALL = Plan().small_shape  # the benchmark's small shape (b2 h16 s128 d64)
DTYPES = {name: ALL_DTYPES[name] for name in ("bf16", "fp32")}


def _step(stack, x, do):
    def step():
        out = stack(x)
        torch.autograd.grad(out, (x, *stack.parameters()), do)

    return step


def measure(
    dtype: torch.dtype,
    layers: int,
    rounds: int,
    block: int,
    device: str = "cpu",
    shape: AttnShape = SHAPE,
) -> dict[str, float]:
    """{"te_fast": us, "composite": us, "ratio": r, "ratio_q1": .., "ratio_q3": ..}: median time
    per layer forward+backward of each, and the median (and quartiles) over rounds of the
    paired ratio te_fast / composite of one round. On the CPU the time is the calling thread's
    CPU time; on a GPU the wall clock of `block` back-to-back steps ending in one synchronize
    (what a host-bound training loop sees), eager mode."""
    torch.manual_seed(0)
    dev = torch.device(device)
    x = torch.randn(shape.b, shape.s, shape.h * shape.d, dtype=dtype, device=dev)
    x.requires_grad_()
    do = torch.randn_like(x)
    steps = {
        name: _step(make_stack(shape, layers, use_te, dtype, dev), x, do)
        for name, use_te in (("te_fast", True), ("composite", False))
    }
    cuda = dev.type == "cuda"
    clock = time.perf_counter if cuda else time.thread_time

    def timed(step) -> float:
        t0 = clock()
        for _ in range(block):
            step()
        if cuda:
            torch.cuda.synchronize(dev)
        return (clock() - t0) * 1e6 / block / layers

    for step in steps.values():
        timed(step)
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        for name in order:
            samples[name].append(timed(steps[name]))
    ratios = sorted(t / c for t, c in zip(samples["te_fast"], samples["composite"]))
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios * 3)
    out = {name: statistics.median(s) for name, s in samples.items()}
    out.update(ratio=statistics.median(ratios), ratio_q1=q1, ratio_q3=q3)
    return out


_SETUP = """
import torch
from benchmarks.cases import AttnShape, Plan
from benchmarks.module_bench import make_stack
torch.set_num_threads(1)
torch.manual_seed(0)
shape = AttnShape(b={b}, h={h}, s={s}, d={d})
x = torch.randn({b}, {s}, {h} * {d}, dtype={dtype}).requires_grad_()
do = torch.randn_like(x)
stack = make_stack(shape, {layers}, {use_te}, {dtype}, torch.device("cpu"))
wrt = (x, *stack.parameters())
for _ in range(5):
    torch.autograd.grad(stack(x), wrt, do)
"""


def instructions(dtype: str, layers: int, number: int) -> dict[str, float]:
    """{"te_fast": n, "composite": n}: callgrind instructions per layer forward+backward."""
    from torch.utils.benchmark import Timer

    out = {}
    for name, use_te in (("te_fast", True), ("composite", False)):
        setup = _SETUP.format(
            b=SHAPE.b, h=SHAPE.h, s=SHAPE.s, d=SHAPE.d, layers=layers, use_te=use_te,
            dtype=str(DTYPES[dtype]),
        )  # fmt: skip
        timer = Timer("torch.autograd.grad(stack(x), wrt, do)", setup=setup)
        stats = timer.collect_callgrind(number=number, collect_baseline=False)
        out[name] = stats.counts(denoise=True) / number / layers
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--block", type=int, default=10, help="iterations per timed sample")
    p.add_argument("--dtype", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (thread CPU time), or cuda: wall clock per block of steps and one synchronize",
    )
    p.add_argument(
        "--shape",
        choices=("tiny", "small"),
        default="tiny",
        help="tiny: b1 h2 s16 d8 (host cost only); small: the benchmark's b2 h16 s128 d64",
    )
    p.add_argument(
        "--instructions", action="store_true", help="count instructions (callgrind) instead"
    )
    p.add_argument("--number", type=int, default=20, help="iterations counted (--instructions)")
    a = p.parse_args(argv)
    if a.instructions:
        print(f"callgrind instructions per layer forward+backward, {a.layers}x Linear+attn {SHAPE}")
        for name in a.dtype:
            res = instructions(name, a.layers, a.number)
            te, comp = res["te_fast"], res["composite"]
            print(
                f"  {name}: te_fast {te:9.0f}  composite {comp:9.0f}  "
                f"te_fast - composite {te - comp:+8.0f}  ratio {te / comp:.3f}",
                flush=True,
            )
        return 0
    torch.set_num_threads(a.threads)
    shape = SHAPE if a.shape == "tiny" else SMALL
    if a.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("host_overhead: --device cuda needs a CUDA device")
            return 2
        where, what = torch.cuda.get_device_name(a.device), "wall time"
    else:
        where, what = "CPU", "host time"
    head = f"{a.layers}x Linear+attn {shape}, {where}, torch {torch.__version__}"
    print(f"{what} per layer forward+backward (median of {a.rounds} rounds), {head}")
    for name in a.dtype:
        res = measure(DTYPES[name], a.layers, a.rounds, a.block, a.device, shape)
        te, comp = res["te_fast"], res["composite"]
        print(
            f"  {name}: te_fast {te:7.1f} us  composite {comp:7.1f} us  "
            f"te_fast - composite {te - comp:+7.1f} us  paired ratio {res['ratio']:.3f} "
            f"(quartiles {res['ratio_q1']:.3f}-{res['ratio_q3']:.3f})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
