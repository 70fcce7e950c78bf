"""Read-once Triton row softmax (the Triton tutorial's design), the plain peer of te_fast's forward.

Imported only on a CUDA machine (triton is a GPU-build dependency of torch): a program takes one
row (several short ones), BLOCK = next_power_of_2(sk) columns held in registers, one HBM read and
one write per element.
Long rows spill registers; that is what this plain design reaches, and why it is shown.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_softmax(y_ptr, x_ptr, n_rows, n_cols, scale, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    valid = (rows < n_rows) & (cols < n_cols)
    offsets = rows * n_cols + cols
    x = tl.load(x_ptr + offsets, mask=valid, other=-float("inf")).to(tl.float32)
    x = x * scale
    num = tl.exp(x - tl.max(x, axis=1)[:, None])
    y = num / tl.sum(num, axis=1)[:, None]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=valid)


def rows_per_program(block: int) -> int:
    """Short rows share a program (at least 2048 elements each), as any tuned Triton softmax
    does; one program per row from 2048 columns up."""
    return max(1, 2048 // block)


def num_warps(elements: int) -> int:
    """About 16 elements per thread, 1 to 32 warps."""
    return max(1, min(32, elements // (32 * 16)))


def softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * x) over the last dim of a contiguous CUDA tensor; fp32 math."""
    if not x.is_contiguous():
        raise ValueError("triton peer softmax expects a contiguous tensor")
    sk = x.shape[-1]
    rows = x.numel() // sk
    y = torch.empty_like(x)
    block = triton.next_power_of_2(sk)
    per = rows_per_program(block)
    grid = (triton.cdiv(rows, per),)
    _row_softmax[grid](
        y, x, rows, sk, scale, BLOCK=block, ROWS=per, num_warps=num_warps(block * per)
    )
    return y
