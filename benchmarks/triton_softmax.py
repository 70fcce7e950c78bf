"""Read-once Triton row softmax (the Triton tutorial's design), the plain peer of te_fast's forward.

Imported only on a CUDA machine (triton is a GPU-build dependency of torch): one program per row,
BLOCK = next_power_of_2(sk) columns held in registers, one HBM read and one write per element.
Long rows spill registers; that is what this plain design reaches, and why it is shown.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_softmax(y_ptr, x_ptr, n_cols, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=valid, other=-float("inf")).to(tl.float32)
    x = x * scale
    num = tl.exp(x - tl.max(x, axis=0))
    y = num / tl.sum(num, axis=0)
    tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=valid)


def num_warps(block: int) -> int:
    """About 16 elements per thread, 1 to 32 warps."""
    return max(1, min(32, block // (32 * 16)))


def softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * x) over the last dim of a contiguous CUDA tensor; fp32 math."""
    if not x.is_contiguous():
        raise ValueError("triton peer softmax expects a contiguous tensor")
    sk = x.shape[-1]
    rows = x.numel() // sk
    y = torch.empty_like(x)
    block = triton.next_power_of_2(sk)
    _row_softmax[(rows,)](y, x, sk, scale, BLOCK=block, num_warps=num_warps(block))
    return y
