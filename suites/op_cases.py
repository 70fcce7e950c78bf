"""Inputs for the ten te_fast ops, shared by the op numerics and op contract suites."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import te_ref
from te_fast import _loader
from te_fast import ops as fast

DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8e4m3": torch.float8_e4m3fn,
    "fp8e5m2": torch.float8_e5m2,
}
SOFTMAX_DTYPES = ("fp32", "fp16", "bf16")
CONVERT_DTYPES = ("fp32", "fp16", "bf16", "fp8e4m3", "fp8e5m2")


@dataclass(frozen=True)
class SoftmaxOp:
    """A softmax op pair with its te_fast and te_ref functions."""

    name: str
    fast: object
    ref: object
    rank: int
    masked: bool = False


SOFTMAX_OPS = {
    "scaled_softmax": SoftmaxOp("scaled_softmax", fast.scaled_softmax, te_ref.scaled_softmax, 4),
    "scaled_masked_softmax": SoftmaxOp(
        "scaled_masked_softmax", fast.scaled_masked_softmax, te_ref.scaled_masked_softmax, 4, True
    ),
    "scaled_upper_triang_masked_softmax": SoftmaxOp(
        "scaled_upper_triang_masked_softmax",
        fast.scaled_upper_triang_masked_softmax,
        te_ref.scaled_upper_triang_masked_softmax,
        3,
    ),
    "scaled_aligned_causal_masked_softmax": SoftmaxOp(
        "scaled_aligned_causal_masked_softmax",
        fast.scaled_aligned_causal_masked_softmax,
        te_ref.scaled_aligned_causal_masked_softmax,
        4,
    ),
}


def random_mask(shape, device, fully_masked_row: int | None = 1) -> torch.Tensor:
    """About 30% masked (True), plus one fully masked row per batch entry."""
    mask = torch.rand(shape, device=device) < 0.3
    if fully_masked_row is not None and shape[-2] > fully_masked_row:
        mask[..., fully_masked_row, :] = True
    return mask


def cu_seqlens_from(lengths, device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def random_data(shape, dtype, device, scale=1.0) -> torch.Tensor:
    """Random values in ``dtype`` (fp8 through a float32 draw), never zeros."""
    x = torch.randn(shape, device=device) * scale
    return x.to(dtype)


# ----------------------------------------------------------------------------- contract cases

OP_NAMES = _loader.OP_NAMES  # the ten ops, as te_fast checks for them at import


def op_dtypes(op: str):
    return CONVERT_DTYPES if op.startswith("convert") else SOFTMAX_DTYPES


def contract_args(op: str, dtype: torch.dtype, device, requires_grad: bool = True) -> tuple:
    """Arguments for one call of torch.ops.te_fast.<op>; float inputs require grad when they can."""
    grad = requires_grad and dtype.is_floating_point and dtype.itemsize > 1

    def data(shape, scale=1.0):
        return random_data(shape, dtype, device, scale).requires_grad_(grad)

    shape4, shape3 = (2, 3, 5, 17), (6, 5, 5)
    if op.startswith("convert"):
        # 3 sequences of random lengths (empty ones too) in 20 tokens: a few trailing tokens
        cu = cu_seqlens_from(torch.randint(0, 7, (3,)).tolist(), device)
        if op == "convert_thd_to_bshd":
            return (data((20, 2, 4)), cu, 3, 6)
        return (data((3, 6, 2, 4)), cu, 20)
    base = op[: -len("_fwd")]
    shape = shape3 if "upper_triang" in base else shape4
    if op.endswith("_fwd"):
        if base == "scaled_masked_softmax":
            return (data(shape, 2.0), random_mask((2, 1, 5, 17), device), 0.7)
        return (data(shape, 2.0), 0.7)
    y = torch.softmax(torch.randn(shape, device=device), -1).to(dtype).requires_grad_(grad)
    return (data(shape), y, 0.7)


def call(op: str, args: tuple) -> torch.Tensor:
    return getattr(torch.ops.te_fast, op).default(*args)
