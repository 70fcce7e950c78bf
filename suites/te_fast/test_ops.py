"""te_fast softmax and THD<->BSHD ops against te_ref: numerics, edge cases and argument errors."""

from __future__ import annotations

import pytest
import torch

import te_ref
from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.checks.numerics import K_BACKWARD, K_FORWARD, check_exact, check_ratio
from te_conformance.suites.fuzz.checks import softmax_bwd_refs
from te_conformance.suites.op_cases import (
    BAD_CU_SEQLENS,
    CAUSAL_OPS,
    CONVERT_DTYPES,
    OP_DTYPES,
    ROW_LENGTHS,
    SCALE,
    SOFTMAX_DTYPES,
    SOFTMAX_OPS,
    VARIANTS,
    bad_op_calls,
    cu_seqlens_from,
    random_data,
    range_end_scores,
    softmax_inputs,
)
from te_fast import ops as fast


def _check_softmax(op, x, mask, scale):
    """Forward and backward of one te_fast softmax op against te_ref float64 and same-precision."""
    dtype = x.dtype
    extra = (mask,) if op.masked else ()
    x_fast = x.clone().requires_grad_()
    y = op.fast(x_fast, *extra, scale)
    dy = torch.randn_like(y)
    y.backward(dy)

    y64, dx64 = _ref64(op, x, extra, scale, dy)

    x_lp = x.clone().requires_grad_()
    y_lp = op.ref(x_lp, *extra, scale, compute_dtype=dtype)
    y_lp.backward(dy)

    assert y.dtype == dtype and y.shape == x.shape
    check_ratio("y", y, y64, y_lp, K_FORWARD)
    check_ratio("dx", x_fast.grad, dx64, x_lp.grad, K_BACKWARD)
    return y, x_fast.grad


def _ref64(op, x, extra, scale, dy):
    """(y, dx) of te_ref in float64, computed on devices.reference_device (CUDA where there is
    one, for CPU cases too) and returned on x's device."""
    on = devices.reference_device(x.device)
    x64 = x.to(device=on, dtype=torch.float64).requires_grad_()
    y64 = op.ref(x64, *devices.to_device(extra, on), scale, compute_dtype=torch.float64)
    y64.backward(dy.to(device=on, dtype=torch.float64))
    return y64.detach().to(x.device), x64.grad.to(x.device)


def _record(op_name, dtype_name, device_name, mask_type="-"):
    """Case fields go to the report first, so that a skipped case is labelled too."""
    record.case(
        impl="te_fast", layout=f"op:{op_name}", dtype=dtype_name, mask_type=mask_type,
        device=device_name,
    )  # fmt: skip


@pytest.mark.parametrize("sk", ROW_LENGTHS, ids=lambda n: f"sk{n}")
@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_softmax(variant, dtype_name, device_name, sk):
    _record(VARIANTS[variant][0], dtype_name, device_name, VARIANTS[variant][1] or "-")
    device = devices.require(device_name)
    op, x, mask = softmax_inputs(variant, sk, device, OP_DTYPES[dtype_name], 2.0)
    record.case(shapes={"x": list(x.shape)})
    _check_softmax(op, x, mask, SCALE)


@pytest.mark.parametrize("sk", (17, 1000, 20000), ids=lambda n: f"sk{n}")
@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_softmax_large_magnitude(variant, dtype_name, device_name, sk):
    """|x| ~ 1e4 at scale 1: the max subtraction must happen in fp32 before exp."""
    _record(VARIANTS[variant][0], dtype_name, device_name, "large_magnitude")
    device = devices.require(device_name)
    op, x, mask = softmax_inputs(variant, sk, device, OP_DTYPES[dtype_name], 1e4)
    x = x.float().clamp(-6e4, 6e4).to(x.dtype)  # stay inside fp16's range
    record.case(shapes={"x": list(x.shape)})
    _check_softmax(op, x, mask, 1.0)


# One row length per CUDA forward path (see ROW_LENGTHS): one-element chunks, a warp, one
# 128-thread CTA, the long kernel on one CTA and on a cluster of four, the two-pass kernel.
RANGE_END_LENGTHS = (17, 1000, 4096, 20000, 70000, 131080)


@pytest.mark.parametrize("scale", (1.0, SCALE, -SCALE), ids=lambda s: f"scale{s}")
@pytest.mark.parametrize("sk", RANGE_END_LENGTHS, ids=lambda n: f"sk{n}")
@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_softmax_range_end_scores(variant, dtype_name, device_name, sk, scale):
    """Scores near the dtype's range ends (an additive mask of finfo(dtype).min in a fully masked
    row, as post_scale_bias and ALiBi calls pass at scale 1 and pre_scale_bias ones at the
    softmax scale). The row's softmax is still defined (1 / n on the n columns holding its max,
    0 elsewhere: softmax is shift-invariant) and the same-precision composite computes it. For
    bf16, scale * log2 e times such a score is past fp32's range (the CUDA kernels' base-2
    exponent); for fp32 at a scale that fp32 does not hold exactly (0.7), a shift taken from
    fl(scale * x) is ~1e31 off the argument formed in double (NaN rows on the CPU before
    this test). On an H100 it found two more: an argument x * scale - max fused
    into one fma (the product's rounding error, ~1e22, in place of 0 at the max: fp32 rows NaN
    or 0 at scale 0.7), and bf16 rows whose shift fl(max * c) is finite but coarse (half an ulp
    of it is up to 2^103). The negative scale takes the 16-bit kernels' other exponent path."""
    _record(VARIANTS[variant][0], dtype_name, device_name, "range_end")
    device = devices.require(device_name)
    op, x, mask = softmax_inputs(variant, sk, device, OP_DTYPES[dtype_name], 2.0)
    x = range_end_scores(x)
    record.case(shapes={"x": list(x.shape)})
    y, dx = _check_softmax(op, x, mask, scale)
    assert not torch.isnan(y).any() and not torch.isnan(dx).any()


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("sk", (5, 2000), ids=lambda n: f"sk{n}")
def test_fully_masked_rows_are_zero(dtype_name, device_name, sk):
    """Every column masked -> the row is 0 (not uniform, not NaN), in y and in dx."""
    _record("scaled_masked_softmax", dtype_name, device_name, "fully_masked")
    device = devices.require(device_name)
    dtype = OP_DTYPES[dtype_name]
    x = random_data((2, 3, 7, sk), dtype, device, 2.0)
    mask = torch.zeros(2, 1, 7, sk, dtype=torch.bool, device=device)
    mask[0] = True  # batch 0: every row fully masked
    mask[1, :, 3] = True  # batch 1: row 3
    y, dx = _check_softmax(SOFTMAX_OPS["scaled_masked_softmax"], x, mask, SCALE)
    for t in (y, dx):
        assert not torch.isnan(t).any()
        assert (t[0] == 0).all() and (t[1, :, 3] == 0).all()
    # bottom-right causal with sq > sk: the first sq - sk rows keep no column
    x = random_data((1, 2, sk + 3, sk), dtype, device, 2.0)
    y, dx = _check_softmax(SOFTMAX_OPS["scaled_aligned_causal_masked_softmax"], x, None, SCALE)
    for t in (y, dx):
        assert not torch.isnan(t).any() and (t[:, :, :3] == 0).all()


@pytest.mark.parametrize("device_name", devices.device_params())
def test_neg_inf_rows_are_zero(device_name):
    """A row whose kept scores are all -inf (e.g. from an additive -inf bias) is 0 as well."""
    _record("scaled_softmax", "fp32", device_name, "neg_inf_rows")
    device = devices.require(device_name)
    x = torch.randn(1, 2, 4, 40, device=device)
    x[0, 1, 2] = float("-inf")
    x[0, 0, 1, 5:] = float("-inf")
    y = fast.scaled_softmax(x, 1.0)
    assert (y[0, 1, 2] == 0).all() and not torch.isnan(y).any()
    assert (y[0, 0, 1, 5:] == 0).all() and torch.allclose(
        y[0, 0, 1].sum(), torch.tensor(1.0, device=device)
    )


# Row lengths for the one-live-column rows: 1 (every row keeps at most one column) and one per
# CUDA forward path of ROW_LENGTHS (one-element chunks, a warp, CTAs, the long kernel).
ONE_COLUMN_LENGTHS = (1, 3, 17, 128, 1000, 4099, 20000)


def _one_live_column(variant: str, sk: int, gen: torch.Generator):
    """(op, x, mask, expected) where every row has at most one live column: the op's own mask
    (causal rule, explicit mask) keeps it alone in some rows -- row 0 top-left causal, row
    sq - sk bottom-right with sq > sk, every even row of an explicit mask, every row at sk = 1 --
    and elsewhere the other kept columns score -inf. ``expected`` is typed, not computed: 1.0 at
    the live column, 0.0 elsewhere, all 0.0 in a row with nothing kept (CPU tensors)."""
    op_name, mask_kind = VARIANTS[variant]
    op = SOFTMAX_OPS[op_name]
    bottom_right = op_name == "scaled_aligned_causal_masked_softmax"
    sq = sk + 2 if bottom_right and sk <= 128 else 5
    shape = (6, sq, sk) if op.rank == 3 else (2, 3, sq, sk)
    i = torch.arange(sq).view(sq, 1)
    j = torch.arange(sk).view(1, sk)
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if op_name == "scaled_upper_triang_masked_softmax":
        keep = j <= i
    elif bottom_right:
        keep = j <= i + sk - sq
    keep = keep.expand(shape)
    mask = None
    if op.masked:
        mshape = (shape[0] if mask_kind == "batch" else 1, 1, sq, sk)
        mask = torch.rand(mshape, generator=gen) < 0.3
        alone = torch.randint(sk, (*mshape[:-1], 1), generator=gen)
        mask[..., ::2, :] = torch.ones(mshape, dtype=torch.bool).scatter(-1, alone, False)[
            ..., ::2, :
        ]
        keep = keep & ~mask
    live = (torch.rand(shape, generator=gen) - 2 * (~keep).float()).argmax(-1, keepdim=True)
    expected = torch.zeros(shape).scatter(-1, live, 1.0) * keep.any(-1, keepdim=True)
    x = (torch.randn(shape, generator=gen) * 3).masked_fill(keep & (expected == 0), float("-inf"))
    return op, x, mask, expected


@pytest.mark.parametrize("sk", ONE_COLUMN_LENGTHS, ids=lambda n: f"sk{n}")
@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_one_live_column_is_exactly_one(variant, dtype_name, device_name, sk):
    """A row with one live column gives exactly 1.0 there and exactly 0.0 elsewhere, bit for
    bit, whatever the op, dtype and row length: exp(0) = 1 over a sum of 1 leaves nothing to
    round. No error-ratio floor applies (SPEC §6's tiny-tensor floor would hide 1 - 1 ulp)."""
    _record(VARIANTS[variant][0], dtype_name, device_name, VARIANTS[variant][1] or "-")
    device = devices.require(device_name)
    gen = torch.Generator().manual_seed(sk * 31 + SOFTMAX_DTYPES.index(dtype_name))
    op, x, mask, expected = _one_live_column(variant, sk, gen)
    record.case(shapes={"x": list(x.shape)})
    dtype = OP_DTYPES[dtype_name]
    extra = (mask.to(device),) if op.masked else ()
    y = op.fast(x.to(device=device, dtype=dtype), *extra, SCALE)
    assert y.dtype == dtype and y.shape == x.shape
    check_exact("y", y, expected.to(device))


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("sk", (33, 3000), ids=lambda n: f"sk{n}")
def test_strided_inputs_match_contiguous(device_name, sk):
    """Non-contiguous inputs (a transposed view, a broadcast mask) give the contiguous result."""
    _record("scaled_softmax", "bf16", device_name, "strided_inputs")
    device = devices.require(device_name)
    base = torch.randn(1, 5, 3, sk, device=device, dtype=torch.bfloat16)
    x = base.transpose(1, 2)  # (1, 3, 5, sk), not contiguous
    mask = (torch.rand(1, 1, 1, sk, device=device) < 0.3).expand(1, 1, 5, sk)
    assert not x.is_contiguous() and not mask.is_contiguous()
    for got, want in (
        (fast.scaled_softmax(x, SCALE), fast.scaled_softmax(x.contiguous(), SCALE)),
        (
            fast.scaled_masked_softmax(x, mask, SCALE),
            fast.scaled_masked_softmax(x.contiguous(), mask.contiguous(), SCALE),
        ),
    ):
        assert got.is_contiguous() and torch.equal(got, want)


def _misaligned_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values in a contiguous view that starts one element into its buffer."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert view.storage_offset() == 1 and view.is_contiguous()
    return view


@pytest.mark.parametrize("sk", (40, 128, 1000, 4096), ids=lambda n: f"sk{n}")
@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
def test_softmax_misaligned_views(dtype_name, device_name, sk):
    """Tensors that start mid-vector (storage offset 1) take the one-element path: same accuracy.

    The row lengths are ones whose aligned tensors the CUDA kernels read in wide vectors.
    """
    _record("scaled_softmax", dtype_name, device_name, "misaligned")
    device = devices.require(device_name)
    dtype = OP_DTYPES[dtype_name]
    op = SOFTMAX_OPS["scaled_softmax"]
    x = random_data((1, 3, 5, sk), dtype, device, 2.0)
    dy = random_data((1, 3, 5, sk), dtype, device)
    record.case(shapes={"x": list(x.shape)})
    y = fast.scaled_softmax(_misaligned_copy(x), SCALE)
    dx = fast.scaled_softmax_bwd(_misaligned_copy(dy), _misaligned_copy(y), SCALE)

    y64, dx64 = _ref64(op, x, (), SCALE, dy)
    xr = x.clone().requires_grad_()
    yr = op.ref(xr, SCALE, compute_dtype=dtype)
    yr.backward(dy)
    check_ratio("y", y, y64, yr, K_FORWARD)
    check_ratio("dx", dx, dx64, xr.grad, K_BACKWARD)


# The causal ops' backwards (CAUSAL_OPS: each row's kept prefix alone, SPEC §3), one row length
# per CUDA backward path (ROW_LENGTHS), and a few misaligned views (one-element accesses).
KEPT_PREFIX_CASES = [(sk, "aligned") for sk in ROW_LENGTHS] + [
    (sk, "misaligned") for sk in (40, 1000, 4096)
]


def _poisoned(t: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """t with NaN and +inf (alternate columns) wherever ``kept`` is False."""
    odd = torch.arange(t.shape[-1], device=t.device) % 2 == 1
    return t.masked_fill(~kept & ~odd, float("nan")).masked_fill(~kept & odd, float("inf"))


@pytest.mark.parametrize("case", KEPT_PREFIX_CASES, ids=lambda c: f"sk{c[0]}-{c[1]}")
@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("op_name", CAUSAL_OPS)
def test_causal_backward_reads_only_kept_columns(op_name, dtype_name, device_name, case):
    """SPEC §3: a causal op's backward reads dy and y only in each row's kept prefix and writes
    dx = +0 past it. dy and y there hold NaN and inf: dx must still match te_ref's backward of
    the clean (dy, y) (SPEC §6) and be +0, bit for bit, past the prefix. sq = 5 rows: the
    upper-triangular op keeps 1..5 leading columns of each (long rows are mostly wholly masked
    chunks), the bottom-right one all but the last 4..0 (rows of sk < 5 columns are partly
    fully masked); a kernel that reads whole rows gives NaN rows.

    TE's own kernels (SPEC §7; its fused softmax sources are not in the 2.20.2 wheel: read at
    the commit docs/te_kernels.md names, whose files are release_v2.19's) load dy and y only in
    the kept prefix and leave zeros in their registers past it:
    scaled_upper_triang_masked_softmax.cu:296-320 (element_index < local_seq) and
    scaled_aligned_causal_masked_softmax.cu:296-320 (j < masked_elements = i + cols - rows + 1);
    their writes (:339-353, :339-357) give scale * (0 - 0 * sum) there, +0 at the positive scales
    TE is called with (-0 at a negative one, where te_fast writes +0: the sign of a zero, not
    run here, since this test calls te_fast's ops)."""
    sk, layout = case
    _record(op_name, dtype_name, device_name, "kept_prefix")
    device = devices.require(device_name)
    dtype = OP_DTYPES[dtype_name]
    op = SOFTMAX_OPS[op_name]
    shape = (3, 5, sk) if op.rank == 3 else (1, 3, 5, sk)
    record.case(shapes={"x": list(shape)})
    x = random_data(shape, dtype, device, 2.0)
    dy = random_data(shape, dtype, device)
    y = op.fast(x, SCALE)
    kept = te_ref.kept_columns(op_name, 5, sk, device)
    copy = _misaligned_copy if layout == "misaligned" else torch.clone
    dx = getattr(fast, f"{op_name}_bwd")(copy(_poisoned(dy, kept)), copy(_poisoned(y, kept)), SCALE)

    ref64, lp = softmax_bwd_refs(dy, y, SCALE, dtype, kept)
    check_ratio("dx", dx, ref64, lp, K_BACKWARD)
    past = dx.masked_select(~kept)
    assert torch.equal(past, torch.zeros_like(past)) and not past.signbit().any(), (
        f"dx past the kept prefix: {past.unique()[:8].tolist()} (want +0 everywhere)"
    )


# ----------------------------------------------------------------------------- conversions

# name -> (lengths, max_seqlen or None (= max length), trailing tokens past cu_seqlens[-1])
CONVERT_CASES = {
    "random": (None, None, 0),
    "zero_length": ([3, 0, 5, 0], None, 0),
    "b1": ([7], None, 0),
    "max_seqlen_larger": ([2, 6, 1], 11, 0),
    "trailing_tokens": ([4, 2], None, 5),
    "all_empty": ([0, 0], 3, 2),
}


def _convert_case(case, device):
    lengths, max_seqlen, trailing = CONVERT_CASES[case]
    if lengths is None:
        lengths = torch.randint(0, 9, (5,)).tolist()
    max_seqlen = max_seqlen if max_seqlen is not None else max(max(lengths), 1)
    cu = cu_seqlens_from(lengths, device)
    return cu, len(lengths), max_seqlen, sum(lengths) + trailing


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", CONVERT_DTYPES)
@pytest.mark.parametrize("case", list(CONVERT_CASES))
def test_convert(case, dtype_name, device_name):
    """thd->bshd and bshd->thd are exact copies with zeros elsewhere; round trip is identity."""
    _record("convert", dtype_name, device_name, case)
    device = devices.require(device_name)
    dtype = OP_DTYPES[dtype_name]
    cu, b, max_seqlen, t = _convert_case(case, device)
    h, d = 3, 5
    thd = random_data((t, h, d), dtype, device)
    record.case(shapes={"thd": [t, h, d], "b": b, "max_seqlen": max_seqlen})

    bshd = fast.convert_thd_to_bshd(thd, cu, b, max_seqlen)
    assert bshd.shape == (b, max_seqlen, h, d) and bshd.dtype == dtype
    check_exact("bshd", bshd, te_ref.convert_thd_to_bshd(thd, cu, b, max_seqlen))

    back = fast.convert_bshd_to_thd(bshd, cu, t)
    assert back.shape == (t, h, d) and back.dtype == dtype
    check_exact("thd", back, te_ref.convert_bshd_to_thd(bshd, cu, t))
    used = int(cu[-1])
    check_exact("round_trip_valid", back[:used], thd[:used])
    check_exact("round_trip_trailing_zero", back[used:], torch.zeros_like(back[used:]))

    if dtype.itemsize > 1:  # gradients: fp8 storage is not differentiable
        thd_g = thd.clone().requires_grad_()
        out = fast.convert_thd_to_bshd(thd_g, cu, b, max_seqlen)
        g = torch.randn_like(out)
        out.backward(g)
        thd64 = thd.to(torch.float64).requires_grad_()
        te_ref.convert_thd_to_bshd(thd64, cu, b, max_seqlen).backward(g.to(torch.float64))
        check_exact("dthd", thd_g.grad, thd64.grad)

        bshd_g = bshd.clone().requires_grad_()
        out = fast.convert_bshd_to_thd(bshd_g, cu, t)
        g = torch.randn_like(out)
        out.backward(g)
        bshd64 = bshd.to(torch.float64).requires_grad_()
        te_ref.convert_bshd_to_thd(bshd64, cu, t).backward(g.to(torch.float64))
        check_exact("dbshd", bshd_g.grad, bshd64.grad)


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("case", list(BAD_CU_SEQLENS))
def test_convert_rejects_bad_cu_seqlens(case, device_name, monkeypatch):
    """Bad cu_seqlens: a clear error on CPU (and on CUDA with TE_FAST_DEBUG_CHECKS=1); on CUDA
    by default no host sync is allowed, so the affected sequences come back as NaN. Never OOB."""
    _record("convert", "fp32", device_name, f"bad_cu_seqlens:{case}")
    device = devices.require(device_name)
    cu_list, b, max_seqlen, t, message = BAD_CU_SEQLENS[case]
    cu = torch.tensor(cu_list, dtype=torch.int32, device=device)
    thd = torch.randn(t, 2, 3, device=device)
    bshd = torch.randn(b, max_seqlen, 2, 3, device=device)
    if device.type == "cuda":
        monkeypatch.delenv("TE_FAST_DEBUG_CHECKS", raising=False)
        poisoned = fast.convert_thd_to_bshd(thd, cu, b, max_seqlen)
        assert torch.isnan(poisoned).any(), "bad cu_seqlens must be visible (NaN), not silent"
        assert torch.isnan(fast.convert_bshd_to_thd(bshd, cu, t)).any()
        torch.cuda.synchronize()  # no illegal access happened
        monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    with pytest.raises(RuntimeError, match=f"convert_thd_to_bshd.*{message}"):
        fast.convert_thd_to_bshd(thd, cu, b, max_seqlen)
    if case != "longer_than_max_seqlen":  # bshd's own padded length bounds every sequence there
        with pytest.raises(RuntimeError, match=f"convert_bshd_to_thd.*{message}"):
            fast.convert_bshd_to_thd(torch.randn(b, 9, 2, 3, device=device), cu, t)


# ----------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("case", list(bad_op_calls("meta")))
def test_argument_errors(case, device_name):
    """Invalid input raises a RuntimeError naming the op, the argument and what was expected."""
    _record("argument_errors", "-", device_name, case)
    device = devices.require(device_name)
    fn, message = bad_op_calls(device)[case]
    with pytest.raises(RuntimeError, match=f"te_fast: .*{message}"):
        fn()
