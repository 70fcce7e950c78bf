"""Kernel-development sweep (GPU): every softmax op, dtype and row length, checked and timed.

Run: PYTHONPATH=. python tools/softmax_sweep.py [--sk 32,2048] [--dtypes bf16] [--numel 268435456]
For each case the op's output is checked on a few rows against a float64 softmax (a wrong kernel
is printed as WRONG, never as a speed), then timed: median of --reps CUDA-event timings, as a
fraction of the device-to-device copy bandwidth measured at the start of the same run.
`python -m benchmarks` is the project's benchmark; this is the quick loop for kernel work.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {"bf16": 8e-3, "fp16": 1e-3, "fp32": 1e-6}  # max |y - y64| on probabilities


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def ref_softmax(x, scale, keep):
    s = (x.double() * scale).masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1)
    return torch.nan_to_num(p, nan=0.0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sk", default="32,64,128,256,512,1024,2048,4096,8192,16384,32768,65536")
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--numel", type=int, default=1 << 28)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    from te_fast import ops

    dev = torch.device("cuda")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_()
    dst = torch.empty_like(src)
    ceiling = 2 * src.numel() / (median_ms(lambda: dst.copy_(src), 30) * 1e-3) / 1e9
    del src, dst
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    scale = 0.125
    rows = []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        numel = args.numel if dtype != torch.float32 else args.numel // 2
        for sk in (int(s) for s in args.sk.split(",")):
            b, h = 4, 16
            sq = max(1, numel // (b * h * sk))
            x = torch.randn(b, h, sq, sk, device=dev, dtype=dtype)
            mask = torch.rand(b, 1, sq, sk, device=dev) < 0.2
            nb = x.numel() * x.element_size()
            i = torch.arange(sq, device=dev).view(sq, 1)
            j = torch.arange(sk, device=dev).view(1, sk)
            cases = {
                "plain": (lambda: ops.scaled_softmax(x, scale), torch.ones_like(mask[:1]), 2 * nb),
                "masked": (
                    lambda: ops.scaled_masked_softmax(x, mask, scale),
                    ~mask,
                    2 * nb + mask.numel(),
                ),
                "uppertri": (
                    lambda: ops.scaled_upper_triang_masked_softmax(
                        x.view(b * h, sq, sk), scale
                    ).view(b, h, sq, sk),
                    (j <= i).view(1, 1, sq, sk),
                    2 * nb,
                ),
                "aligned": (
                    lambda: ops.scaled_aligned_causal_masked_softmax(x, scale),
                    (j <= i + sk - sq).view(1, 1, sq, sk),
                    2 * nb,
                ),
            }
            line = [f"{dname} sk={sk:<6}"]
            for name, (fn, keep, moved) in cases.items():
                y = fn()
                n = min(sq, 3)
                want = ref_softmax(x[:2, :, :n], scale, keep[:2, :, :n] if keep.shape[0] > 1
                                   else keep[:, :, :n])
                err = (y[:2, :, :n].double() - want).abs().max().item()
                ok = err <= TOL[dname] and not torch.isnan(y).any().item()
                ms = median_ms(fn, args.reps)
                frac = moved / (ms * 1e-3) / 1e9 / ceiling
                line.append(f"{name} {100 * frac:5.1f}%" + ("" if ok else f" WRONG({err:.1e})"))
                rows.append((dname, sk, name, frac, ok))
                del y
            y = ops.scaled_softmax(x, scale)
            dy = torch.randn_like(y)
            dx = ops.scaled_softmax_bwd(dy, y, scale)
            yd = y[:1, :, :2].double()
            ref = scale * yd * (dy[:1, :, :2].double() - (dy[:1, :, :2].double() * yd).sum(-1, True))
            err = (dx[:1, :, :2].double() - ref).abs().max().item()
            ok = err <= 4 * TOL[dname] * max(1.0, ref.abs().max().item())
            ms = median_ms(lambda: ops.scaled_softmax_bwd(dy, y, scale), args.reps)
            line.append(f"bwd {100 * 3 * nb / (ms * 1e-3) / 1e9 / ceiling:5.1f}%"
                        + ("" if ok else f" WRONG({err:.1e})"))
            ms = median_ms(lambda: torch.softmax(x, -1), args.reps)
            line.append(f"torch {100 * 2 * nb / (ms * 1e-3) / 1e9 / ceiling:5.1f}%")
            print("  ".join(line), flush=True)
            del x, mask, y, dy, dx
            torch.cuda.empty_cache()
    bad = [r for r in rows if not r[4]]
    print(f"{len(rows)} forward cases, {len(bad)} WRONG")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
