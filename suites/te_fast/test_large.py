"""Tensors past 2^31 elements (GPU; select with `-m large`): int32 offsets would silently
corrupt them. Softmax forward and backward on more than 2^31 elements (and on more than 2^32
rows), both conversions, and the module on a THD batch whose score tensor has more than 2^31
elements; checked on sampled rows (the first, those around element 2^31, the last) against
te_ref under SPEC §6, and in full where a check is cheap (copies, zeros).

The tests run one at a time across xdist workers (a file lock), each needing at most ~40 GiB;
each skips with a reason when the GPU has less free memory than it needs, or unless `-m large`
selects them (they would crowd an ordinary run on one GPU)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

import pytest
import torch

import te_fast
import te_ref
from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.checks.numerics import K_BACKWARD, K_FORWARD, check_exact, check_ratio
from te_conformance.suites.fuzz.checks import softmax_bwd_refs
from te_conformance.suites.op_cases import LARGE_SCALE, TWO31, GiB, sample_rows
from te_fast import ops as fast

pytestmark = [pytest.mark.gpu, pytest.mark.large]
LOCK = os.path.join(tempfile.gettempdir(), "te_conformance_large.lock")


@contextlib.contextmanager
def _gpu_with(request, need_gib: float, what: str):
    """The CUDA device, held alone (file lock) and with need_gib free; else a skip that says why."""
    device = devices.require("cuda")
    markexpr = request.config.getoption("markexpr", default="") or ""
    if "large" not in markexpr:
        pytest.skip(f"{what} needs ~{need_gib:.0f} GiB of GPU memory: select with -m large")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(device)
            if free < need_gib * GiB:
                pytest.skip(f"{what} needs {need_gib:.0f} GiB free, the GPU has "
                            f"{free / GiB:.1f} of {total / GiB:.0f} GiB free")  # fmt: skip
            yield device
        finally:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)




def _fill_randn(t: torch.Tensor, seed: int) -> torch.Tensor:
    """Random normal values in place, chunk by chunk (no 2^31-element temporary)."""
    gen = torch.Generator(device=t.device).manual_seed(seed)
    flat = t.view(-1)
    step = 1 << 28
    for start in range(0, flat.numel(), step):
        chunk = flat[start : start + step]
        chunk.copy_(torch.randn(chunk.shape, generator=gen, device=t.device) * 2)
    return t


# (op, dtype, shape): each past 2^31 elements; the mask of the masked op is per batch element
SOFTMAX_CASES = {
    "plain-sk32": ("scaled_softmax", torch.bfloat16, (1, 1, (TWO31 >> 5) + 3, 32)),
    "plain-sk4096": ("scaled_softmax", torch.bfloat16, (1, 1, (TWO31 >> 12) + 3, 4096)),
    "plain-sk4096-fp32": ("scaled_softmax", torch.float32, (1, 1, (TWO31 >> 12) + 3, 4096)),
    "plain-sk140000": ("scaled_softmax", torch.bfloat16, (1, 1, TWO31 // 140000 + 2, 140000)),
    "masked-sk4096": ("scaled_masked_softmax", torch.bfloat16, ((TWO31 >> 18) + 1, 1, 64, 4096)),
    "aligned_causal-sk4096": (
        "scaled_aligned_causal_masked_softmax", torch.bfloat16, ((TWO31 >> 18) + 1, 1, 64, 4096)
    ),
    "upper_triang-2048": (
        "scaled_upper_triang_masked_softmax", torch.bfloat16, ((TWO31 >> 22) + 1, 2048, 2048)
    ),
}  # fmt: skip


def _row_context(op, x, mask, row):
    """(the slab te_ref needs for this row: x, mask, and the row's index in the slab)."""
    sq, sk = x.shape[-2], x.shape[-1]
    if op in ("scaled_softmax", "scaled_masked_softmax"):  # rows without a position
        flat = x.view(-1, sk)[row].view(1, 1, 1, sk)
        m = None if mask is None else mask.view(-1, sk)[row].view(1, 1, 1, sk)
        return flat, m, 0
    slab = x.view(-1, sq, sk)[row // sq].view((1,) * (x.dim() - 2) + (sq, sk))
    return slab, None, row % sq


@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax_past_2_31(case, request):
    """Forward and backward of a softmax op on more than 2^31 elements: the sampled rows
    (first, around element 2^31, last) against te_ref under SPEC §6."""
    op, dtype, shape = SOFTMAX_CASES[case]
    numel = torch.Size(shape).numel()
    assert numel > TWO31
    record.case(impl="te_fast", layout=f"large:{op}", dtype=str(dtype).split(".")[-1],
                device="cuda", shapes={"x": list(shape)})  # fmt: skip
    need = numel * dtype.itemsize * 4 / GiB + (numel / GiB if "masked" in case else 0) + 4
    with _gpu_with(request, need, f"softmax on {numel} elements") as device:
        x = _fill_randn(torch.empty(shape, dtype=dtype, device=device), 1)
        mask = None
        if op == "scaled_masked_softmax":
            mask = torch.empty(shape, dtype=torch.bool, device=device)
            gen = torch.Generator(device=device).manual_seed(2)
            for b in range(0, shape[0], 1024):
                mask[b : b + 1024] = torch.rand(mask[b : b + 1024].shape, generator=gen,
                                                device=device) < 0.3  # fmt: skip
        spec = getattr(fast, op)
        y = spec(x, mask, LARGE_SCALE) if mask is not None else spec(x, LARGE_SCALE)
        dy = _fill_randn(torch.empty_like(x), 3)
        dx = getattr(fast, f"{op}_bwd")(dy, y, LARGE_SCALE)
        sk = shape[-1]
        rows = numel // sk
        for row in sample_rows(rows, sk):
            xs, ms, i = _row_context(op, x, mask, row)
            refs = {}
            for compute in (torch.float64, dtype):
                ref = getattr(te_ref, op)
                r = (
                    ref(xs, ms, LARGE_SCALE, compute_dtype=compute)
                    if ms is not None
                    else ref(xs, LARGE_SCALE, compute_dtype=compute)
                )
                refs[compute] = r.reshape(-1, sk)[i]
            got = y.view(-1, sk)[row]
            check_ratio(f"y row {row}", got, refs[torch.float64], refs[dtype], K_FORWARD)
            dyr = dy.view(-1, sk)[row]
            ref64, lp = softmax_bwd_refs(dyr, got, LARGE_SCALE, dtype)
            check_ratio(f"dx row {row}", dx.view(-1, sk)[row], ref64, lp, K_BACKWARD)


ROWS_PAST_2_32 = (1 << 32) + 8


@pytest.mark.parametrize("op", ["scaled_aligned_causal_masked_softmax", "scaled_masked_softmax"])
def test_softmax_past_2_32_rows(op, request):
    """More than 2^32 rows of one column (the kernels' 64-bit row arithmetic): bottom-right
    causal keeps only the last row; an explicit mask keeps exactly its unmasked rows (y = 1,
    masked 0); the backward of one-column rows is 0. Checked in full."""
    rows = ROWS_PAST_2_32
    record.case(impl="te_fast", layout=f"large:{op}", dtype="bf16", device="cuda",
                shapes={"x": [1, 1, rows, 1]})  # fmt: skip
    with _gpu_with(request, 40, f"{rows} one-column rows") as device:
        x = torch.ones(1, 1, rows, 1, dtype=torch.bfloat16, device=device)
        if op == "scaled_masked_softmax":
            mask = torch.zeros(1, 1, rows, 1, dtype=torch.bool, device=device)
            mask[..., 1::3, :] = True
            mask[..., -1, :] = True
            y = fast.scaled_masked_softmax(x, mask, 1.0)
            del x
            assert torch.equal(y.view(torch.int16), (~mask).to(torch.bfloat16).view(torch.int16))
        else:
            y = fast.scaled_aligned_causal_masked_softmax(x, 1.0)
            del x
            # any(), not count_nonzero: that widens 2^32 flags to int64 (32 GiB, past the
            # 40 GiB this test holds; OOM on an H200 beside other workers)
            assert not bool(y[0, 0, :-1].any()) and y[0, 0, -1, 0].item() == 1.0
        dx = fast.scaled_softmax_bwd(y, y, 1.0)
        assert not bool(dx.any()), "the backward of one-column rows is 0"


# (dtype, h, d, lengths, trailing tokens): past 2^31 elements on both sides of the conversion;
# bf16 rows of 4096 bytes (16-byte units), fp8 rows of 3 bytes (1-byte units)
CONVERT_CASES = {
    "bf16-h16-d128": (torch.bfloat16, 16, 128, [131072] * 3 + [0] + [131072] * 3 + [262146], 3),
    "fp8-h1-d3": (torch.float8_e4m3fn, 1, 3, [178956971] * 3 + [0, 178956972], 2),
}


@pytest.mark.parametrize("case", list(CONVERT_CASES))
def test_conversions_past_2_31(case, request):
    """thd -> bshd -> thd on more than 2^31 elements: every sequence copied exactly, padding and
    trailing tokens zero (checked in full), the last sequence against te_ref."""
    dtype, h, d, lengths, trailing = CONVERT_CASES[case]
    t = sum(lengths) + trailing
    b, max_seqlen = len(lengths), max(lengths) + 1
    assert t * h * d > TWO31 and b * max_seqlen * h * d > TWO31
    shapes = {"thd": [t, h, d], "bshd": [b, max_seqlen, h, d]}
    record.case(impl="te_fast", layout="large:convert", dtype=str(dtype).split(".")[-1],
                device="cuda", shapes=shapes)  # fmt: skip
    elems = t * h * d + b * max_seqlen * h * d
    need = elems * dtype.itemsize * 2.5 / GiB + 6
    with _gpu_with(request, need, f"conversions of {t * h * d} elements") as device:
        cu_list = [0]
        for n in lengths:
            cu_list.append(cu_list[-1] + n)
        cu = torch.tensor(cu_list, dtype=torch.int32, device=device)
        thd = torch.empty(t, h, d, dtype=dtype, device=device)
        thd.view(torch.uint8).random_(1, 120)  # nonzero bytes: every copy is visible
        bshd = fast.convert_thd_to_bshd(thd, cu, b, max_seqlen)
        raw_bshd, raw_thd = bshd.view(torch.uint8), thd.view(torch.uint8)
        for x in range(b):
            n = lengths[x]
            assert torch.equal(raw_bshd[x, :n], raw_thd[cu_list[x] : cu_list[x + 1]]), x
            assert int(torch.count_nonzero(raw_bshd[x, n:])) == 0, f"padding of sequence {x}"
        back = fast.convert_bshd_to_thd(bshd, cu, t)
        used = cu_list[-1]
        assert torch.equal(back.view(torch.uint8)[:used], raw_thd[:used])
        assert int(torch.count_nonzero(back.view(torch.uint8)[used:])) == 0, "trailing tokens"
        del back, bshd
        last = thd[cu_list[-2] : cu_list[-1]]
        one = torch.tensor([0, lengths[-1]], dtype=torch.int32, device=device)
        fast_last = fast.convert_thd_to_bshd(last, one, 1, max_seqlen)
        ref_last = te_ref.convert_thd_to_bshd(last, one, 1, max_seqlen)
        check_exact("last sequence", fast_last, ref_last)


MODULE_THD = ([8192, 5003, 7001], 5, 16, 64, 8192)  # lengths, trailing tokens, h, d, max_seqlen


def test_module_thd_scores_past_2_31(request):
    """UnfusedDotProductAttention on a THD batch (padding_causal, a trailing token) whose score
    tensor [b, h, max_seqlen, max_seqlen] has more than 2^31 elements; output and gradients of
    two sequences (the first and the last) and two heads against te_ref on that sub-problem under
    SPEC §6; trailing token rows exactly 0."""
    lengths, trailing, h, d, s = MODULE_THD
    b = len(lengths)
    assert b * h * s * s > TWO31
    record.case(impl="te_fast", layout="large:thd_thd_thd", dtype="bf16", device="cuda",
                mask_type="padding_causal", shapes={"b": b, "h": h, "s": s, "d": d})  # fmt: skip
    with _gpu_with(request, 40, f"a module score tensor of {b * h * s * s} elements") as device:
        cu_list = [0]
        for n in lengths:
            cu_list.append(cu_list[-1] + n)
        t = cu_list[-1] + trailing
        cu = torch.tensor(cu_list, dtype=torch.int32, device=device)
        gen = torch.Generator(device=device).manual_seed(5)
        q, k, v = (torch.randn(t, h, d, generator=gen, device=device, dtype=torch.bfloat16)
                   .requires_grad_() for _ in range(3))  # fmt: skip
        grad_out = torch.randn(t, h * d, generator=gen, device=device, dtype=torch.bfloat16)
        kwargs = dict(qkv_layout="thd_thd_thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                      attn_mask_type="padding_causal")  # fmt: skip
        attn = te_fast.UnfusedDotProductAttention(d**-0.5)
        out = attn(q, k, v, max_seqlen_q=s, max_seqlen_kv=s, **kwargs)
        dq, dk, dv = torch.autograd.grad(out, [q, k, v], grad_out)
        assert int(torch.count_nonzero(out[cu_list[-1] :])) == 0, "trailing tokens must be 0"
        assert int(torch.count_nonzero(dq[cu_list[-1] :])) == 0
        heads = [0, h - 1]
        for x in (0, b - 1):
            rows = slice(cu_list[x], cu_list[x + 1])
            n = lengths[x]
            sub_cu = torch.tensor([0, n], dtype=torch.int32, device=device)
            go = grad_out[rows].view(n, h, d)[:, heads].reshape(n, len(heads) * d)
            refs = {}
            for compute in (torch.float64, torch.bfloat16):
                leaves = [t_[rows][:, heads].detach().to(compute).requires_grad_()
                          for t_ in (q, k, v)]  # fmt: skip
                ref_out = te_ref.dot_product_attention(
                    *leaves, softmax_scale=d**-0.5, max_seqlen_q=n, max_seqlen_kv=n,
                    compute_dtype=compute,
                    **dict(kwargs, cu_seqlens_q=sub_cu, cu_seqlens_kv=sub_cu),
                )  # fmt: skip
                grads = torch.autograd.grad(ref_out, leaves, go.to(compute))
                refs[compute] = (ref_out.detach(), *grads)
            got = (
                out[rows].view(n, h, d)[:, heads].reshape(n, -1),
                dq[rows][:, heads], dk[rows][:, heads], dv[rows][:, heads],
            )  # fmt: skip
            ks = (K_FORWARD, K_BACKWARD, K_BACKWARD, K_BACKWARD)
            for i, name in enumerate(("out", "dq", "dk", "dv")):
                r64, lp = refs[torch.float64][i], refs[torch.bfloat16][i]
                check_ratio(f"sequence {x} {name}", got[i], r64, lp, ks[i], torch.bfloat16)
