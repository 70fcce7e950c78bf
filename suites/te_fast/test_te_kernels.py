"""Transformer Engine's own fused softmax kernels (adapters/te_kernels) judged by the op cases.

Two shapes per op case: `op_case`, test_ops.py's own inputs (sq = 5 and b*h = 3, which TE's
warp-per-row dispatchers mostly reject: those skip with TE's reason), and `te_shape`, the same op,
dtype and row length at the smallest sq (and attn_batches) that TE's dispatchers accept. A
limit of TE's (softmax.cpp's checks, the dispatchers' "Unsupported shape.") skips with TE's
message; any other difference fails: a TE deviation, expected to fail (docs/te_kernels.md).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import te_ref
from te_conformance.suites import expected, skips
from te_conformance.suites.adapters import te_kernels
from te_conformance.suites.checks.failures import VALUE_CHECKS, CheckError
from te_conformance.suites.checks.numerics import K_BACKWARD, K_FORWARD, check_ratio
from te_conformance.suites.op_cases import (
    OP_DTYPES,
    ROW_LENGTHS,
    SCALE,
    SOFTMAX_DTYPES,
    VARIANTS,
    random_data,
    random_mask,
    range_end_scores,
    softmax_inputs,
)

pytestmark = pytest.mark.gpu

SHAPES = ("op_case", "te_shape")
TE_SQUARE_MAX = 4096  # test_ops.py's SQUARE_MAX["cuda"]


TE = te_kernels.TE_KERNELS  # the op adapter: te_fast's softmax op table over TE's kernels


def _require_te():
    skips.unless("environment", [TE.unavailable_reason("cuda")])
    return torch.device("cuda")


def te_shape_inputs(variant: str, sk: int, device, dtype, magnitude: float):
    """x (and mask) for ``variant`` at row length sk, shaped as TE's dispatchers accept."""
    op_name, mask_kind = VARIANTS[variant]
    bpb = te_kernels.batches_per_block(sk)
    if te_kernels.RANK[op_name] == 3:
        s = sk if sk <= TE_SQUARE_MAX else 64
        shape = (te_kernels.batches_per_block(s), s, s)
    else:
        sq = max(bpb, 8)
        shape = (3, 1, sq, sk) if mask_kind == "batch" else (1, 3, sq, sk)
    x = random_data(shape, dtype, device, magnitude)
    mask = None
    if mask_kind:
        mask = random_mask((shape[0] if mask_kind == "batch" else 1, 1, shape[2], sk), device)
    return x, mask


def _case(variant, shape_kind, sk, device, dtype, magnitude):
    op_name = VARIANTS[variant][0]
    if shape_kind == "op_case":
        _, x, mask = softmax_inputs(variant, sk, device, dtype, magnitude)
    else:
        x, mask = te_shape_inputs(variant, sk, device, dtype, magnitude)
    # TE's own limits, and the shapes whose run would kill the CUDA context (TE deviation 4)
    shape = None if mask is None else tuple(mask.shape)
    skips.unless("declined", TE.declines(op_name, tuple(x.shape), x.dtype, shape))
    return op_name, x, mask


def check_te(op_name: str, x, mask, scale: float):
    """TE's forward and backward against te_ref float64 and the same-precision composite."""
    extra = (mask,) if op_name in te_kernels.MASKED else ()
    y = TE.forward(op_name, x, *extra, scale)
    dy = torch.randn_like(y)
    dy_before = dy.clone()
    dx = TE.backward(op_name, dy, y, scale)
    ref = getattr(te_ref, op_name)
    refs = {}
    for compute in (torch.float64, x.dtype):
        xr = x.to(compute).requires_grad_()
        yr = ref(xr, *extra, scale, compute_dtype=compute)
        yr.backward(dy.to(compute))
        refs[compute] = (yr, xr.grad)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(dy, dy_before), "TE's backward wrote into dy"
    check_ratio("y", y, refs[torch.float64][0], refs[x.dtype][0], K_FORWARD)
    check_ratio("dx", dx, refs[torch.float64][1], refs[x.dtype][1], K_BACKWARD)
    return y, dx


@pytest.mark.parametrize("sk", ROW_LENGTHS, ids=lambda n: f"sk{n}")
@pytest.mark.parametrize("shape_kind", SHAPES)
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_te_softmax(variant, dtype_name, shape_kind, sk):
    device = _require_te()
    op_name, x, mask = _case(variant, shape_kind, sk, device, OP_DTYPES[dtype_name], 2.0)
    check_te(op_name, x, mask, SCALE)


@pytest.mark.parametrize("sk", (1000, 4096), ids=lambda n: f"sk{n}")
@pytest.mark.parametrize("dtype_name", ("fp16", "bf16"))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_te_softmax_range_end_scores(variant, dtype_name, sk):
    """test_ops.py's range-end scores (|x| near finfo.max): rows whose kept scores are all below
    -10000 while the row has a masked column come back 0 from TE's masked and aligned-causal
    kernels (the -10000 fill wins the max): TE deviation 1, expected there (y and dx)."""
    device = _require_te()
    op_name, x, mask = _case(variant, "te_shape", sk, device, OP_DTYPES[dtype_name], 2.0)
    if op_name in ("scaled_masked_softmax", "scaled_aligned_causal_masked_softmax"):
        deviation = TE.deviations[1]
        expected.expect(replace(deviation, checks=VALUE_CHECKS, tensors=("y", "dx")))
    check_te(op_name, range_end_scores(x), mask, 1.0)


@pytest.mark.parametrize("dtype_name", ("fp16", "bf16"))
def test_te_fully_masked_rows_are_zero(dtype_name):
    """TE's masked kernel zeroes a row whose max is the -10000 fill (scale_value = 0): fully
    masked rows are 0 in y and dx, as the SPEC asks; aligned causal writes 0 past the band."""
    device = _require_te()
    dtype = OP_DTYPES[dtype_name]
    x = random_data((2, 3, 8, 40), dtype, device, 2.0)
    mask = torch.zeros(2, 1, 8, 40, dtype=torch.bool, device=device)
    mask[0] = True
    mask[1, :, 3] = True
    y, dx = check_te("scaled_masked_softmax", x, mask, SCALE)
    for t in (y, dx):
        assert not torch.isnan(t).any() and (t[0] == 0).all() and (t[1, :, 3] == 0).all()
    x = random_data((1, 2, 48 + 8, 48), dtype, device, 2.0)
    y, dx = check_te("scaled_aligned_causal_masked_softmax", x, None, SCALE)
    for t in (y, dx):
        assert not torch.isnan(t).any() and (t[:, :, :8] == 0).all()


# ----------------------------------------------------------------------------- TE deviations

# Each reproducer is the smallest input that shows one; run against TE they fail, expected
# (suites/expected.py: strict, a pass means TE changed, and docs/te_kernels.md must say so).


def _deviates(number: int, tensor: str, check) -> None:
    """Run ``check`` (an assertion about ``tensor``) where TE's deviation ``number`` is
    expected: its AssertionError is that deviation's "value" failure."""
    expected.expect(TE.deviations[number])
    try:
        check()
    except AssertionError as e:
        raise CheckError.new("value", tensor, str(e)) from e


@pytest.mark.parametrize("dtype_name", ("fp16", "bf16"))
def test_te_deviation_masked_fill_beats_kept_scores(dtype_name):
    """Kept scores of -20000 beside one masked column: softmax over the kept columns is uniform;
    TE's kernel takes max = -10000 (the fill), sets scale_value = 0 and returns a zero row."""
    device = _require_te()
    x = torch.full((1, 1, 32, 64), -20000.0, dtype=OP_DTYPES[dtype_name], device=device)
    mask = torch.zeros(1, 1, 32, 64, dtype=torch.bool, device=device)
    mask[..., 0] = True
    y = TE.forward("scaled_masked_softmax", x, mask, 1.0)
    want = torch.full_like(y, 1 / 63)
    want[..., 0] = 0
    _deviates(1, "y", lambda: torch.testing.assert_close(y, want))


@pytest.mark.parametrize("dtype_name", ("fp16", "bf16"))
def test_te_deviation_masked_columns_get_probability(dtype_name):
    """Kept scores near -10000 (-9990: -9992 in fp16, -9984 in bf16): masked columns, filled
    with -10000, get exp(-8) / exp(-16) of the weight each instead of exactly 0. (-9996 rounds
    to -10000 in fp16, the fill itself, and deviation 1 then zeroes the whole row: that XPASSed
    on an H100.)"""
    device = _require_te()
    x = torch.full((1, 1, 32, 64), -9990.0, dtype=torch.float32, device=device)
    x = x.to(OP_DTYPES[dtype_name])
    mask = torch.zeros(1, 1, 32, 64, dtype=torch.bool, device=device)
    mask[..., 32:] = True
    y = TE.forward("scaled_masked_softmax", x, mask, 1.0)

    def zero():
        assert (y[..., 32:] == 0).all(), f"masked columns got up to {float(y[..., 32:].max())}"

    _deviates(2, "y", zero)


def test_te_deviation_aligned_causal_padding_columns():
    """Aligned causal at sk = 24 (TE pads the row to 32 in registers, filled with -10000, not
    -inf) and every score -10000: the last row keeps all 24 columns, so each is 1/24; TE's sum
    counts the 8 pad columns too and gives 1/32."""
    device = _require_te()
    x = torch.full((1, 1, 8, 24), -10000.0, dtype=torch.float16, device=device)
    y = TE.forward("scaled_aligned_causal_masked_softmax", x, 1.0)
    want = torch.full((24,), 1 / 24, device=device)
    _deviates(3, "y", lambda: torch.testing.assert_close(y[0, 0, -1].float(), want))
