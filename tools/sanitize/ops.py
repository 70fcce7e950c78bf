"""Drive every te_fast kernel path at its edges, for compute-sanitizer (tools/sanitize/run.sh runs
memcheck, racecheck, initcheck and synccheck over it; tools/gpu_run.sh --sanitize calls that).

    PYTHONPATH=. PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        --error-exitcode 1 python3 tools/sanitize/ops.py --module
    PYTHONPATH=. python3 tools/sanitize/ops.py --device cpu --module     # dry run, no GPU

Without the caching allocator every tensor is its own cudaMalloc, so a read or write past a
tensor's end is outside any allocation and memcheck reports it (inside a cached block it would
not be seen). The softmax cases cover each kernel path and its edges (csrc/cuda/softmax_impl.cuh):
one column, partial warps, every register width with 16-byte and with one-element accesses (odd
lengths, views that start one element into their buffer), the last register widths and the
first of the next, 2/4/8-CTA clusters, the two-pass kernel past 128K columns; every mask mode
(none, explicit broadcast and per batch, top-left and bottom-right causal), fully masked rows,
-inf rows, and scores near the dtype's range ends. The conversions: every access width
(16/8/4/2/1 bytes), fp8 storage, empty sequences, no sequence at all, trailing tokens, an empty
output, and bad cu_seqlens (non-monotone, negative, past the buffer, a nonzero start, a sequence
longer than max_seqlen, num_tokens too small), which the kernels must survive without leaving the
tensors: on CUDA (without TE_FAST_DEBUG_CHECKS) they poison with NaN, on the CPU the op raises;
both are checked.
--module adds tools/sanitize/module.py (the module's forward and backward). --reduced is the
shorter list for racecheck, which is about a hundred times slower.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import te_fast  # noqa: E402
from te_conformance.suites.op_cases import range_end_scores  # noqa: E402
from te_fast import ops  # noqa: E402

# Row lengths: one column; inside one thread's chunks; a warp's lanes (partial and whole);
# every register width's last length and the next one's first (1024/1025 for the one-element
# path, 4096/4099 one CTA); 2-, 4- and 8-CTA clusters (16384 .. 131072); the two-pass kernel
# (131080 for fp32 and 16-bit alike, 140000).
COLS = (1, 7, 31, 32, 33, 40, 100, 128, 256, 500, 1000, 1023, 1024, 1025, 2048, 4096, 4099,
        16384, 20000, 33000, 70000, 131072, 131080, 140000)  # fmt: skip
REDUCED_COLS = (1, 33, 100, 1024, 4099, 20000, 33000, 70000, 140000)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
REDUCED_DTYPES = (torch.float32, torch.bfloat16)


class Counter:
    """Op calls made, and the time they took; progress lines for a run that may be cut short."""

    def __init__(self):
        self.calls = 0
        self.start = time.time()

    def __call__(self, n: int = 1) -> None:
        self.calls += n

    def progress(self, what: str) -> None:
        print(f"sanitize_ops: {what}: {self.calls} op calls, {time.time() - self.start:.0f} s",
              flush=True)  # fmt: skip


def softmax_cases(dev: torch.device, reduced: bool, count: Counter) -> None:
    """Every softmax op, forward and backward, on every row length and dtype of the list."""
    for dtype in REDUCED_DTYPES if reduced else DTYPES:
        count.progress(f"softmax {dtype}")
        for sk in REDUCED_COLS if reduced else COLS:
            long_row = sk > 16384
            for sq in (1,) if long_row else (1, 3):
                b, h = (2, 1) if long_row else (2, 3)
                x = torch.randn(b, h, sq, sk, device=dev, dtype=dtype)
                if sq > 1:
                    x[0, 0, 1] = float("-inf")  # a row of -inf scores: all 0
                dy = torch.randn_like(x)
                mask = torch.rand(b, 1, sq, sk, device=dev) < 0.3
                mask[0, :, 0] = True  # a fully masked row
                y = ops.scaled_softmax(x, 0.5)
                ops.scaled_softmax_bwd(dy, y, 0.5)
                y = ops.scaled_masked_softmax(x, mask, 0.5)
                ops.scaled_masked_softmax(x, mask[:1], 0.5)  # broadcast mask
                ops.scaled_masked_softmax_bwd(dy, y, 0.5)
                y = ops.scaled_aligned_causal_masked_softmax(x, 0.5)
                ops.scaled_aligned_causal_masked_softmax_bwd(dy, y, 0.5)
                count(7)
            # scores near the range ends (rows at 0.76-1 times finfo.max, negative and positive,
            # and one that ends in ordinary scores): the cold branches where the shift
            # fl(max * c) is coarse (shift_coarse: minus_max_block, the clusters' row_coarse,
            # the two-pass rerun), and base e at a negative scale
            far = range_end_scores(torch.randn(1, 1, 3, sk, device=dev, dtype=dtype))
            ops.scaled_softmax(far, 0.7)
            ops.scaled_softmax(far, -0.7)
            ops.scaled_masked_softmax(far, mask[:1, :, :1].expand(1, 1, 3, sk), 0.7)
            count(3)
            if sk == 33000:
                # More rows than one wave of 8-CTA clusters holds (fp32 and 16-bit alike take
                # clusters of 8 here): the backward's clusters walk several rows each, through
                # both row-parity slot sets of their exchange.
                x = torch.randn(1, 1, 64, sk, device=dev, dtype=dtype)
                y = ops.scaled_softmax(x, 0.5)
                ops.scaled_softmax_bwd(torch.randn_like(x), y, 0.5)
                count(2)
            # contiguous views one element into their buffers: the one-element-access path (x
            # misaligned; or x aligned and the mask misaligned)
            rows = 2 if long_row else 6
            buf = torch.randn(rows * sk + 1, device=dev, dtype=dtype)
            x = buf[1:].view(1, rows, 1, sk)
            mbuf = torch.rand(sk + 1, device=dev) < 0.3
            y = ops.scaled_softmax(x, 0.5)
            ops.scaled_masked_softmax(x, mbuf[:sk].view(1, 1, 1, sk), 0.5)
            ops.scaled_masked_softmax(x.clone(), mbuf[1:].view(1, 1, 1, sk), 0.5)
            ops.scaled_softmax_bwd(y, y, 0.5)
            count(4)
            # top-left causal: square rows where they fit, else a few rows (and sq > sk: rows
            # that keep every column); bottom-right causal with sq > sk: fully masked rows
            sq = sk if sk <= (512 if reduced else 2048) else 3
            x = torch.randn(2, sq, sk, device=dev, dtype=dtype)
            y = ops.scaled_upper_triang_masked_softmax(x, 0.5)
            ops.scaled_upper_triang_masked_softmax_bwd(torch.randn_like(x), y, 0.5)
            x = torch.randn(1, 1, min(sk, 64) + 2, sk, device=dev, dtype=dtype)
            ops.scaled_aligned_causal_masked_softmax(x, 0.5)
            count(3)
    # empty tensors: no rows, no columns
    for shape in ((0, 2, 3, 8), (2, 0, 3, 8), (2, 3, 0, 8), (2, 3, 4, 0)):
        x = torch.randn(shape, device=dev, dtype=torch.bfloat16)
        y = ops.scaled_softmax(x, 1.0)
        ops.scaled_softmax_bwd(y, y, 1.0)
        ops.scaled_masked_softmax(x, torch.zeros(1, 1, *shape[2:], device=dev, dtype=torch.bool),
                                  1.0)  # fmt: skip
        count(3)


# name -> (cu_seqlens, batch, max_seqlen, tokens, whether valid)
CONVERT_CASES = {
    "valid": ([0, 3, 3, 10], 3, 8, 12, True),  # an empty sequence, 2 trailing tokens
    "no_sequence": ([0], 0, 4, 5, True),
    "all_empty": ([0, 0, 0], 2, 3, 4, True),
    "empty_output": ([0, 0], 1, 0, 0, True),
    "full": ([0, 6, 12], 2, 6, 12, True),
    "non_monotone": ([0, 7, 2, 9], 3, 8, 12, False),
    "negative": ([0, -3, 4, 9], 3, 8, 12, False),
    "past_the_buffer": ([0, 4, 9, 40], 3, 8, 12, False),
    "nonzero_start": ([2, 4, 9, 11], 3, 8, 12, False),
    "longer_than_max_seqlen": ([0, 1, 2, 12], 3, 8, 12, False),
    "num_tokens_too_small": ([0, 5, 9, 12], 3, 8, 10, False),
}
REDUCED_CONVERT = ("valid", "non_monotone", "past_the_buffer", "longer_than_max_seqlen")
# (dtype, h, d): rows of 64, 32 (16-byte units), 12 (4-byte), 6 (2-byte), 3 bytes (1-byte units)
CONVERT_ROWS = (
    (torch.float32, 2, 8), (torch.bfloat16, 2, 8), (torch.float32, 1, 3), (torch.float16, 1, 3),
    (torch.float8_e4m3fn, 1, 3), (torch.float8_e5m2, 2, 8), (torch.float64, 2, 2),
)  # fmt: skip


def _expect(dev, valid: bool, what: str, fn, *args) -> torch.Tensor | None:
    """Run one conversion: a valid one returns; a bad one raises on the CPU (and on CUDA with
    TE_FAST_DEBUG_CHECKS=1), and on CUDA otherwise returns with NaN where the rows were bad."""
    debug = os.environ.get("TE_FAST_DEBUG_CHECKS", "") not in ("", "0")
    raises = not valid and (dev.type == "cpu" or debug)
    try:
        out = fn(*args)
    except RuntimeError as e:
        if raises and any(w in str(e) for w in ("cu_seqlens", "max_seqlen", "shape[")):
            return None
        raise
    if raises:
        raise AssertionError(f"{what}: bad cu_seqlens raised no error on {dev.type}")
    if not valid and out.numel() and not torch.isnan(out.float()).any():
        raise AssertionError(f"{what}: bad cu_seqlens left no NaN in the output")
    return out


def convert_cases(dev: torch.device, reduced: bool, count: Counter) -> None:
    names = REDUCED_CONVERT if reduced else tuple(CONVERT_CASES)
    rows = CONVERT_ROWS[:3] + CONVERT_ROWS[4:5] if reduced else CONVERT_ROWS
    for dtype, h, d in rows:
        for name in names:
            cu_list, b, s, t, valid = CONVERT_CASES[name]
            cu = torch.tensor(cu_list, dtype=torch.int32, device=dev)
            thd = torch.randn(t, h, d, device=dev).to(dtype)
            bshd = torch.randn(b, s, h, d, device=dev).to(dtype)
            what = f"{name} {dtype} h{h} d{d}"
            _expect(dev, valid, what, ops.convert_thd_to_bshd, thd, cu, b, s)
            _expect(dev, valid, what, ops.convert_bshd_to_thd, bshd, cu, t)
            count(2)
            if name == "valid":  # views one element into their buffers: narrower units
                buf = torch.randn(t * h * d + 1, device=dev).to(dtype)
                out = ops.convert_thd_to_bshd(buf[1:].view(t, h, d), cu, b, s)
                buf = torch.randn(out.numel() + 1, device=dev).to(dtype)
                ops.convert_bshd_to_thd(buf[1:].view(out.shape), cu, t)
                count(2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"),
        help="cuda (default; under compute-sanitizer) or cpu (a dry run)",
    )  # fmt: skip
    parser.add_argument("--reduced", action="store_true", help="the short list (racecheck)")
    parser.add_argument(
        "--module", action="store_true",
        help="also the module's forward and backward (tools/sanitize/module.py)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    reason = te_fast.device_unavailable_reason(args.device)
    if args.device == "cuda" and not torch.cuda.is_available():
        reason = reason or "no CUDA device"
    if reason:
        print(f"sanitize_ops: {reason}", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    count = Counter()
    softmax_cases(dev, args.reduced, count)
    count.progress("conversions")
    convert_cases(dev, args.reduced, count)
    summary = f"{count.calls} op calls"
    if args.module:
        from tools.sanitize import module as sanitize_module

        count.progress("module")
        n = sanitize_module.run(dev, args.reduced)
        summary += f", {n} module calls (forward and backward)"
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"sanitize_ops: done: {summary} on {dev.type} in {time.time() - count.start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
