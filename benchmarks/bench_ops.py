"""Times te_fast's ops on the GPU against the copy-bandwidth ceiling measured in the same run.

Run: python -m benchmarks.bench_ops [--out reports/bench] [--reps 50]
Each figure is the median of --reps CUDA-event timings after warm-up, on tensors far larger than
the L2 cache. Achieved bandwidth counts each input read once and each output written once.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch


def median_ms(fn, reps: int, warmup: int = 5) -> tuple[float, float]:
    """(median, interquartile spread) in milliseconds of fn() timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    q = statistics.quantiles(times, n=4)
    return statistics.median(times), q[2] - q[0]


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/bench", help="folder for bench.json / bench.md")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_ops: no CUDA device; nothing to time", file=sys.stderr)
        return 2
    import te_fast
    from te_fast import ops

    reason = te_fast.device_unavailable_reason("cuda")
    if reason:
        print(f"bench_ops: {reason}", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = []

    def add(name, shape, fn, moved):
        ms, spread = median_ms(fn, args.reps)
        gbs = moved / (ms * 1e-3) / 1e9
        rows.append({"case": name, "shape": shape, "median_ms": ms, "iqr_ms": spread, "GB/s": gbs})
        print(
            f"{name:<48} {shape:<24} {ms:8.3f} ms  (IQR {spread:.3f})  {gbs:7.0f} GB/s", flush=True
        )

    def copy_ceiling():
        src = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_()
        dst = torch.empty_like(src)
        add("copy ceiling (1 GiB device-to-device)", "1 GiB", lambda: dst.copy_(src), 2 << 30)

    def softmax_rows(sk):
        b, h, sq = 4, 16, max(1, (1 << 26) // (4 * 16 * sk))  # 64M elements (128 MB in bf16)
        shape = f"[{b},{h},{sq},{sk}] bf16"
        x = torch.randn(b, h, sq, sk, device=dev, dtype=torch.bfloat16)
        y = ops.scaled_softmax(x, 0.125)
        dy = torch.randn_like(y)
        mask = torch.rand(b, 1, sq, sk, device=dev) < 0.2
        io2, io3 = 2 * nbytes(x), 3 * nbytes(x)
        add(f"scaled_softmax_fwd sk={sk}", shape, lambda: ops.scaled_softmax(x, 0.125), io2)
        add(f"torch.softmax (eager, reference) sk={sk}", shape, lambda: torch.softmax(x, -1), io2)
        add(
            f"scaled_masked_softmax_fwd sk={sk}",
            shape,
            lambda: ops.scaled_masked_softmax(x, mask, 0.125),
            io2 + nbytes(mask),
        )
        add(
            f"scaled_aligned_causal_masked_softmax_fwd sk={sk}",
            shape,
            lambda: ops.scaled_aligned_causal_masked_softmax(x, 0.125),
            io2,
        )
        add(f"scaled_softmax_bwd sk={sk}", shape, lambda: ops.scaled_softmax_bwd(dy, y, 0.125), io3)

    copy_ceiling()
    ceiling = rows[0]["GB/s"]
    for sk in (128, 1024, 4096, 16384):
        softmax_rows(sk)

    b, s, h, d = 32, 2048, 16, 128
    lengths = torch.randint(s // 2, s + 1, (b,))
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    cu = cu.to(dev)
    t = int(lengths.sum())
    thd = torch.randn(t, h, d, device=dev, dtype=torch.bfloat16)
    bshd = ops.convert_thd_to_bshd(thd, cu, b, s)
    add(
        "convert_thd_to_bshd",
        f"t={t} h={h} d={d} bf16",
        lambda: ops.convert_thd_to_bshd(thd, cu, b, s),
        nbytes(thd) + nbytes(bshd),
    )
    add(
        "convert_bshd_to_thd",
        f"[{b},{s},{h},{d}] bf16",
        lambda: ops.convert_bshd_to_thd(bshd, cu, t),
        nbytes(thd) + nbytes(bshd),
    )

    for r in rows:
        r["fraction_of_copy"] = r["GB/s"] / ceiling
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "reps": args.reps,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"{result['gpu']}, torch {result['torch']}, CUDA {result['cuda']}, {result['date']}; "
        f"median of {args.reps} runs",
        "",
        "| case | shape | median ms | GB/s | of copy ceiling |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['shape']} | {r['median_ms']:.3f} | {r['GB/s']:.0f} | "
            f"{100 * r['fraction_of_copy']:.0f}% |"
        )
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
