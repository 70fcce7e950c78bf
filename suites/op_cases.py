"""Inputs for every te_fast op of the registry, shared by the op numerics and contract suites."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import te_ref
from te_conformance.suites import cases
from te_fast import _registry
from te_fast import ops as fast

OP_DTYPES = {  # every dtype an op takes: suites.cases.DTYPES and the conversions' fp8 storage
    **cases.DTYPES,
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
    causal: bool = False  # its backward reads each row's kept prefix alone (SPEC §3)


# public name -> op, for every softmax forward of the registry (te_ref names its functions alike)
SOFTMAX_OPS = {
    spec.public: SoftmaxOp(
        spec.public,
        getattr(fast, spec.public),
        getattr(te_ref, spec.public),
        spec.rank,
        spec.masked,
        spec.causal,
    )
    for spec in _registry.OPS
    if spec.kind == _registry.SOFTMAX_FWD
}
# the causal ops, in the registry's order
CAUSAL_OPS = tuple(name for name, op in SOFTMAX_OPS.items() if op.causal)


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

# ----------------------------------------------------------------------------- softmax rows

# The lengths, plus one per CUDA kernel shape and access path that they miss (see
# csrc/cuda/softmax_impl.cuh; V = elements per access, 8 for 16-bit and 4 for fp32 data when
# sk % V == 0, else 1). 16-byte forward: 16 and 40 (two threads per row, whole and partial
# chunks), 128 and 256 (4 and 8 lanes per row), 1000 (16-bit: a warp, last chunk partial; fp32:
# the long kernel), 4096 (16-bit: one 128-thread CTA), 16384 (16-bit: one 512-thread CTA; fp32:
# one long-kernel CTA), 20000, 33000 and 70000 (the long kernel on 1, 2 and 4 CTAs for 16-bit, 2,
# 4 and 8 for fp32), 131080 (past every shape: two-pass). Backward: 16384, 20000 and 33000
# (clusters of 2, 4 and 8 CTAs for 16-bit, 4, 8 and 8 of four chunks a thread for fp32), 70000
# and 131080 (two-pass). One element per access: 1, 7, 17, 500 (16-bit), 1023, 4099.
ROW_LENGTHS = (
    1, 7, 16, 17, 40, 128, 256, 500, 1000, 1023, 4096, 4099, 16384, 20000, 33000, 70000, 131080
)  # fmt: skip


SQUARE_MAX = {"cpu": 1000, "cuda": 4096}  # longest square [ab, s, s] upper-triangular case


SCALE = 0.7


# variant -> (op, mask kind): every softmax op, a masked one with a broadcast mask [1, 1, sq, sk]
# and with a per-batch mask [b, 1, sq, sk]
VARIANTS = {
    (f"{name}-{kind}_mask" if kind else name): (name, kind)
    for name, op in SOFTMAX_OPS.items()
    for kind in (("bcast", "batch") if op.masked else (None,))
}


def softmax_inputs(variant: str, sk: int, device: torch.device, dtype, magnitude: float):
    """x (and mask) with b*h odd (3) and sq not a multiple of 4 (5)."""
    op_name, mask_kind = VARIANTS[variant]
    if SOFTMAX_OPS[op_name].rank == 3:
        shape = (3, sk, sk) if sk <= SQUARE_MAX[device.type] else (3, 5, sk)
    elif mask_kind == "batch":
        shape = (3, 1, 5, sk)
    else:
        shape = (1, 3, 5, sk)
    x = random_data(shape, dtype, device, magnitude)
    mask = None
    if mask_kind == "bcast":
        mask = random_mask((1, 1, 5, sk), device)
    elif mask_kind == "batch":
        mask = random_mask((3, 1, 5, sk), device)
    return SOFTMAX_OPS[op_name], x, mask


# every C++ op (the registry's OPS), as te_fast checks for them at import; the Python-defined
# attention_core ops (PYTHON_OPS) have suites/te_fast/test_eager_core.py instead
OP_NAMES = _registry.OP_NAMES


def op_dtypes(op: str):
    return SOFTMAX_DTYPES if _registry.BY_NAME[op].is_softmax else CONVERT_DTYPES


# How contract_args lays out its data tensors: "contiguous", or "permuted": dense, but in a storage
# whose first two dims are swapped (what a transposed q or k gives), so that a fake which copies
# its input's strides (empty_like) disagrees with a kernel that writes a contiguous output.
CONTRACT_LAYOUTS = ("contiguous", "permuted")


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "contiguous":
        return t
    assert layout == "permuted", layout
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def contract_args(
    op: str, dtype: torch.dtype, device, requires_grad: bool = True, layout: str = "contiguous"
) -> tuple:
    """Arguments for one call of torch.ops.te_fast.<op>; float inputs require grad when they can,
    and are laid out as ``layout`` says (CONTRACT_LAYOUTS; masks and cu_seqlens stay contiguous)."""
    spec = _registry.BY_NAME[op]
    grad = requires_grad and dtype.is_floating_point and dtype.itemsize > 1

    def data(shape, scale=1.0):
        return _laid_out(random_data(shape, dtype, device, scale), layout).requires_grad_(grad)

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
    y = torch.softmax(torch.randn(shape, device=device), -1).to(dtype)
    return (data(shape), _laid_out(y, layout).requires_grad_(grad), 0.7)


def call(op: str, args: tuple) -> torch.Tensor:
    return getattr(torch.ops.te_fast, op).default(*args)


# ----------------------------------------------------------------------------- bad arguments

# name -> (cu_seqlens, batch, max_seqlen, tokens, message): the value rules of cu_seqlens, which
# the CPU checks always and CUDA under TE_FAST_DEBUG_CHECKS=1 (else the kernels poison with NaN)
BAD_CU_SEQLENS = {
    "non_monotone": ([0, 5, 3, 8], 3, 8, 8, "non-decreasing"),
    "negative": ([0, -2, 4], 2, 8, 6, "non-decreasing"),
    "longer_than_max_seqlen": ([0, 2, 9], 2, 4, 9, "max_seqlen"),
    "past_the_tokens": ([0, 3, 12], 2, 9, 10, "past"),
    "nonzero_start": ([1, 3, 5], 2, 4, 5, r"cu_seqlens\[0\] == 0"),
    "negative_start": ([-1, 3, 5], 2, 4, 5, r"cu_seqlens\[0\] == 0"),
}


def bad_op_calls(device):
    """case -> (call, expected message): each call breaks exactly one argument rule of the ops
    (shapes, ranks, dtypes, arguments out of range, lengths that the arguments cannot hold)."""
    x4 = torch.randn(2, 3, 5, 7, device=device)
    y4 = torch.softmax(x4, -1)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    thd = torch.randn(5, 2, 3, device=device)
    bshd = torch.randn(2, 3, 2, 3, device=device)

    def mask(*shape, dtype=torch.bool):
        return torch.zeros(shape, dtype=dtype, device=device)

    shape4 = r"\[b, h, sq, sk\]"
    mask_shape = r"mask of shape \[1\|b, 1, sq, sk\]"
    f16_32 = "float16, bfloat16 or float32"
    return {
        "rank": (
            lambda: fast.scaled_softmax(x4[0], 1.0),
            f"scaled_softmax_fwd expects x of shape {shape4}",
        ),
        "dtype": (lambda: fast.scaled_softmax(x4.double(), 1.0), f16_32),
        "int_dtype": (lambda: fast.scaled_aligned_causal_masked_softmax(x4.int(), 1.0), f16_32),
        "triang_rank": (
            lambda: fast.scaled_upper_triang_masked_softmax(x4, 1.0),
            r"\[attn_batches, sq, sk\]",
        ),
        "aligned_rank": (
            lambda: fast.scaled_aligned_causal_masked_softmax(x4[0], 1.0),
            f"scaled_aligned_causal_masked_softmax_fwd expects x of shape {shape4}",
        ),
        "mask_shape": (lambda: fast.scaled_masked_softmax(x4, mask(2, 3, 5, 7), 1.0), mask_shape),
        "mask_batch": (lambda: fast.scaled_masked_softmax(x4, mask(3, 1, 5, 7), 1.0), mask_shape),
        "mask_rank": (lambda: fast.scaled_masked_softmax(x4, mask(5, 7), 1.0), mask_shape),
        # one case per dimension of the shape rule: a check that loses one is caught
        "mask_sq": (lambda: fast.scaled_masked_softmax(x4, mask(1, 1, 4, 7), 1.0), mask_shape),
        "mask_sk": (lambda: fast.scaled_masked_softmax(x4, mask(1, 1, 5, 6), 1.0), mask_shape),
        "mask_dtype": (
            lambda: fast.scaled_masked_softmax(x4, mask(1, 1, 5, 7, dtype=torch.float32), 1.0),
            "mask of dtype bool",
        ),
        "mask_uint8": (
            lambda: fast.scaled_masked_softmax(x4, mask(1, 1, 5, 7, dtype=torch.uint8), 1.0),
            "mask of dtype bool",
        ),
        "bwd_shape": (lambda: fast.scaled_softmax_bwd(y4[:, :2], y4, 1.0), "dy of the same shape"),
        "bwd_dtype": (lambda: fast.scaled_softmax_bwd(y4.half(), y4, 1.0), "dy of the same dtype"),
        "bwd_y_dtype": (
            lambda: fast.scaled_masked_softmax_bwd(y4.double(), y4.double(), 1.0),
            f"expects y of dtype {f16_32}",
        ),
        "bwd_rank": (
            lambda: fast.scaled_upper_triang_masked_softmax_bwd(y4, y4, 1.0),
            r"expects y of shape \[attn_batches, sq, sk\]",
        ),
        "cu_dtype": (
            lambda: fast.convert_thd_to_bshd(thd, cu.long(), 2, 3),
            "cu_seqlens of dtype int32",
        ),
        "cu_float": (
            lambda: fast.convert_thd_to_bshd(thd, cu.float(), 2, 3),
            "cu_seqlens of dtype int32",
        ),
        "cu_int64_bshd": (
            lambda: fast.convert_bshd_to_thd(bshd, cu.long(), 5),
            "cu_seqlens of dtype int32",
        ),
        "cu_shape": (
            lambda: fast.convert_thd_to_bshd(thd, cu, 3, 3),
            r"cu_seqlens of shape \[batch_size \+ 1\]",
        ),
        "cu_rank": (
            lambda: fast.convert_bshd_to_thd(x4.view(2, 3, 5, 7), cu.view(1, 3), 5),
            "cu_seqlens of shape",
        ),
        "cu_empty": (
            lambda: fast.convert_bshd_to_thd(bshd, cu[:0], 5),
            r"cu_seqlens of shape \[batch_size \+ 1\]",
        ),
        "thd_rank": (
            lambda: fast.convert_thd_to_bshd(thd.view(5, 6), cu, 2, 3),
            r"thd of shape \[t, h, d\]",
        ),
        "bshd_rank": (
            lambda: fast.convert_bshd_to_thd(thd, cu, 5),
            r"bshd of shape \[b, s, h, d\]",
        ),
        "bshd_batch": (
            lambda: fast.convert_bshd_to_thd(torch.randn(3, 3, 2, 3, device=device), cu, 5),
            r"cu_seqlens of shape \[b \+ 1\]",
        ),
        "int_storage": (
            lambda: fast.convert_bshd_to_thd(x4.int(), cu, 5),
            "float dtype",
        ),
        "bool_storage": (
            lambda: fast.convert_thd_to_bshd(thd > 0, cu, 2, 3),
            "float dtype",
        ),
        "negative_batch_size": (
            lambda: fast.convert_thd_to_bshd(thd, cu[:1], -1, 3),
            "batch_size >= 0 and max_seqlen >= 0, got -1 and 3",
        ),
        "negative_max_seqlen": (
            lambda: fast.convert_thd_to_bshd(thd, cu, 2, -1),
            "batch_size >= 0 and max_seqlen >= 0, got 2 and -1",
        ),
        "negative_num_tokens": (
            lambda: fast.convert_bshd_to_thd(bshd, cu, -1),
            "num_tokens >= 0, got -1",
        ),
    }


# The value rules that need the cu_seqlens values (raised on the CPU; on CUDA only with
# TE_FAST_DEBUG_CHECKS=1): max_seqlen and num_tokens too small for the lengths.
def bad_op_values(device):
    """case -> (call, expected message)."""
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    thd = torch.randn(5, 2, 3, device=device)
    bshd = torch.randn(2, 3, 2, 3, device=device)
    return {
        "max_seqlen_too_small": (
            lambda: fast.convert_thd_to_bshd(thd, cu, 2, 2),
            "convert_thd_to_bshd: sequence 1 has length 3 > max_seqlen = 2",
        ),
        "bshd_too_short": (
            lambda: fast.convert_bshd_to_thd(bshd[:, :2], cu, 5),
            r"convert_bshd_to_thd: sequence 1 has length 3 > bshd.shape\[1\] = 2",
        ),
        "num_tokens_too_small": (
            lambda: fast.convert_bshd_to_thd(bshd, cu, 4),
            r"convert_bshd_to_thd: cu_seqlens\[2\] = 5 is past num_tokens = 4",
        ),
        "thd_too_short": (
            lambda: fast.convert_thd_to_bshd(thd[:4], cu, 2, 3),
            r"convert_thd_to_bshd: cu_seqlens\[2\] = 5 is past thd.shape\[0\] = 4",
        ),
    }


def range_end_scores(x: torch.Tensor) -> torch.Tensor:
    """x's shape and dtype, its rows (in turn) near the dtype's most negative value, near its
    largest, and 60% near the most negative followed by x's own values: |values| of 0.76 to 1
    times finfo.max, each row within 5% below a level of its own (so that long rows too have
    maxima of many values, not the same one), with ties (bf16 holds 6 to 13 values in 5%)."""
    big = torch.finfo(x.dtype).max
    level = 0.8 + 0.2 * torch.rand(x.shape[:-1] + (1,), device=x.device)
    u = level * (1 - 0.05 * torch.rand(x.shape, device=x.device))
    far = (big * u).to(x.dtype)
    rows = torch.arange(x.shape[-2], device=x.device).view(-1, 1)
    cols = torch.arange(x.shape[-1], device=x.device)
    kind = rows % 3
    out = torch.where(kind == 1, far, -far)
    return torch.where((kind == 2) & (cols >= 0.6 * x.shape[-1]), x, out)


# ----------------------------------------------------------------------------- past 2^31 elements

GiB = 1 << 30


TWO31 = 1 << 31


def sample_rows(rows: int, sk: int) -> list[int]:
    """The first rows, the rows around element 2^31, the last rows."""
    boundary = TWO31 // sk
    picked = {0, 1, boundary - 1, boundary, boundary + 1, rows - 2, rows - 1}
    return sorted(r for r in picked if 0 <= r < rows)


LARGE_SCALE = 0.6  # the softmax scale of the tensors past 2^31 elements
