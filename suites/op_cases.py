"""Inputs for every te_fast op of the registry, shared by the op numerics and contract suites."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import te_ref
from te_fast import _registry
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


# public name -> op, for every softmax forward of the registry (te_ref names its functions alike)
SOFTMAX_OPS = {
    spec.public: SoftmaxOp(
        spec.public,
        getattr(fast, spec.public),
        getattr(te_ref, spec.public),
        spec.rank,
        spec.masked,
    )
    for spec in _registry.OPS
    if spec.kind == _registry.SOFTMAX_FWD
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

OP_NAMES = _registry.OP_NAMES  # every op, as te_fast checks for them at import


def op_dtypes(op: str):
    return SOFTMAX_DTYPES if _registry.BY_NAME[op].is_softmax else CONVERT_DTYPES


def contract_args(op: str, dtype: torch.dtype, device, requires_grad: bool = True) -> tuple:
    """Arguments for one call of torch.ops.te_fast.<op>; float inputs require grad when they can."""
    spec = _registry.BY_NAME[op]
    grad = requires_grad and dtype.is_floating_point and dtype.itemsize > 1

    def data(shape, scale=1.0):
        return random_data(shape, dtype, device, scale).requires_grad_(grad)

    if not spec.is_softmax:
        # 3 sequences of random lengths (empty ones too) in 20 tokens: a few trailing tokens
        cu = cu_seqlens_from(torch.randint(0, 7, (3,)).tolist(), device)
        if spec.kind == _registry.THD_TO_BSHD:
            return (data((20, 2, 4)), cu, 3, 6)
        return (data((3, 6, 2, 4)), cu, 20)
    shape = (6, 5, 5) if spec.rank == 3 else (2, 3, 5, 17)
    if spec.kind == _registry.SOFTMAX_FWD:
        if spec.masked:
            return (data(shape, 2.0), random_mask((2, 1, 5, 17), device), 0.7)
        return (data(shape, 2.0), 0.7)
    y = torch.softmax(torch.randn(shape, device=device), -1).to(dtype).requires_grad_(grad)
    return (data(shape), y, 0.7)


def call(op: str, args: tuple) -> torch.Tensor:
    return getattr(torch.ops.te_fast, op).default(*args)
