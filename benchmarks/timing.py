"""Timing: CUDA-event medians and IQR (GPU), perf_counter (CPU), host wall per iteration."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stats:
    """Median and interquartile range (q3 - q1) of n samples, in milliseconds."""

    median_ms: float
    iqr_ms: float
    n: int


def summarize(samples_ms: list[float]) -> Stats:
    if not samples_ms:
        raise ValueError("no timing samples")
    if len(samples_ms) < 2:
        return Stats(samples_ms[0], 0.0, 1)
    q1, _, q3 = statistics.quantiles(samples_ms, n=4)
    return Stats(statistics.median(samples_ms), q3 - q1, len(samples_ms))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


WARM_MS = 25.0  # device time of back-to-back calls before the timed ones (do_bench's default)


def _warm_for(fn: Callable[[], object], device: torch.device, max_calls: int = 1000) -> None:
    """Run fn() back to back for about WARM_MS of device time.

    A fixed count of warm-up calls is not enough after the host has kept the GPU idle (a compile
    between cases): the SM clock ramps back up over milliseconds, and a kernel measured in that
    window reads slow. Seen on an H200 on 2026-12-04: te_fast's forward at sk = 1024 measured
    0.282 ms (IQR 0.029) right after an inductor compile, 0.253 ms in a run without compiles.
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    once = max(start.elapsed_time(end), 1e-3)
    for _ in range(min(max_calls, int(WARM_MS / once) + 1)):
        fn()
    sync(device)


def time_calls(fn: Callable[[], object], device: torch.device, reps: int, warmup: int) -> Stats:
    """Median/IQR of fn()'s time per call: CUDA events on the GPU, perf_counter on the CPU.

    On the GPU every call is bracketed by its own event pair and the calls are queued back to back
    with one synchronisation at the end, so each sample is the device time of that call.
    """
    for _ in range(warmup):
        fn()
    sync(device)
    if device.type == "cuda":
        _warm_for(fn, device)
    if device.type != "cuda":
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return summarize(samples)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return summarize([s.elapsed_time(e) for s, e in zip(starts, ends)])


def wall_per_iteration(
    fn: Callable[[], object], device: torch.device, reps: int, block: int = 10
) -> Stats:
    """Host wall-clock per iteration: blocks of `block` back-to-back calls, one sync per block.

    This is what a training loop sees when a shape is launch/CPU-overhead bound: the device idles
    while the host prepares the next launch, and CUDA events cannot show the host's share.
    """
    samples = []
    block = max(1, min(block, reps))
    sync(device)
    for _ in range(max(1, reps // block)):
        t0 = time.perf_counter()
        for _ in range(block):
            fn()
        sync(device)
        samples.append((time.perf_counter() - t0) * 1e3 / block)
    return summarize(samples)


@dataclass
class Paired:
    """Paired rounds of two callables: the median ratio a / b over rounds and its quartiles."""

    ratio: float
    q1: float
    q3: float
    rounds: int


def paired_wall(
    a: Callable[[], object],
    b: Callable[[], object],
    device: torch.device,
    rounds: int,
    block: int = 10,
) -> Paired:
    """Host wall clock of `a` against `b`, round by round: each round times a block of `block`
    back-to-back calls of each (one sync per block), in alternating order, and its ratio a / b
    is one sample. Machine noise that lasts longer than a round hits both sides of it alike, so
    the paired ratio holds where two separate stretches of timing swing by 20% and more (the
    host-bound rows of this benchmark on the H200 machine)."""
    sync(device)
    ratios = []
    for r in range(max(1, rounds)):
        times = {}
        for name, fn in (("a", a), ("b", b)) if r % 2 == 0 else (("b", b), ("a", a)):
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            sync(device)
            times[name] = time.perf_counter() - t0
        ratios.append(times["a"] / times["b"])
    if len(ratios) < 2:
        return Paired(ratios[0], ratios[0], ratios[0], 1)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return Paired(statistics.median(ratios), q1, q3, len(ratios))
