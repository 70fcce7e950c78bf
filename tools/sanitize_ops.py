"""Drive every te_fast CUDA kernel at its edge shapes, for compute-sanitizer (memcheck, racecheck).

    PYTHONPATH=. PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_ops.py

Without the caching allocator every tensor is its own cudaMalloc, so a read or write past a
tensor's end is outside any allocation and memcheck reports it (inside a cached block it would
not be seen). The shapes cover each kernel path and its edges: one column, a partial warp, each
warp-path width with and without wide loads, the last warp-path width (1024), the first
block-path width (1025), long rows; masks broadcast and per batch; tensors that start mid-vector
(the one-element path); conversions with empty sequences, trailing tokens, fp8 storage and
cu_seqlens that are out of range or decreasing (which the kernels must survive without leaving
the tensor).
"""

from __future__ import annotations

import sys

import torch

import te_fast
from te_fast import ops

COLS = (1, 7, 31, 33, 40, 128, 256, 500, 1000, 1023, 1024, 1025, 2048, 4099, 20000)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def softmax_cases(dev: torch.device) -> int:
    n = 0
    for dtype in DTYPES:
        for sk in COLS:
            for sq in (1, 3):
                x = torch.randn(2, 3, sq, sk, device=dev, dtype=dtype)
                dy = torch.randn_like(x)
                mask = torch.rand(2, 1, sq, sk, device=dev) < 0.3
                y = ops.scaled_softmax(x, 0.5)
                ops.scaled_softmax_bwd(dy, y, 0.5)
                y = ops.scaled_masked_softmax(x, mask, 0.5)
                ops.scaled_masked_softmax(x, mask[:1], 0.5)
                ops.scaled_masked_softmax_bwd(dy, y, 0.5)
                y = ops.scaled_aligned_causal_masked_softmax(x, 0.5)
                ops.scaled_aligned_causal_masked_softmax_bwd(dy, y, 0.5)
                n += 7
            # a contiguous view one element into its buffer: the kernels' one-element path
            x = torch.randn(2 * 3 * 4 * sk + 1, device=dev, dtype=dtype)[1:].view(2, 3, 4, sk)
            y = ops.scaled_softmax(x, 0.5)
            ops.scaled_softmax_bwd(y, y, 0.5)
            n += 2
            if sk <= 4099:  # square rows for the top-left causal op
                x = torch.randn(3, sk, sk, device=dev, dtype=dtype)
                y = ops.scaled_upper_triang_masked_softmax(x, 0.5)
                ops.scaled_upper_triang_masked_softmax_bwd(torch.randn_like(x), y, 0.5)
                n += 2
    return n


def convert_cases(dev: torch.device) -> int:
    n = 0
    seqlens = {
        "valid": [0, 3, 3, 10],  # an empty sequence, trailing tokens past the last offset
        "beyond_tokens": [0, 4, 9, 40],  # the last offset past t
        "decreasing": [0, 7, 2, 9],
        "longer_than_max": [0, 1, 2, 12],
    }
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        for name, cu in seqlens.items():
            cu_t = torch.tensor(cu, dtype=torch.int32, device=dev)
            thd = torch.randn(12, 2, 8, device=dev).to(dtype)
            bshd = ops.convert_thd_to_bshd(thd, cu_t, 3, 8)
            ops.convert_bshd_to_thd(bshd, cu_t, 12)
            n += 2
            print(f"convert {dtype} {name}: ok", flush=True)
    return n


def main() -> int:
    reason = te_fast.device_unavailable_reason("cuda")
    if reason:
        print(f"sanitize_ops: {reason}", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    n = softmax_cases(dev) + convert_cases(dev)
    torch.cuda.synchronize()
    print(f"sanitize_ops: {n} op calls done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
