"""Eager attention conformance: every adapter against te_ref float64 (SPEC §2, §6)."""

from __future__ import annotations

import pytest
import torch

import te_ref
from reports import record
from suites import contracts, devices
from suites.attention_check import check_case, prepare, run_impl
from suites.cases import (
    AttnCase,
    broad_matrix,
    core_matrix,
    thd_inference_cases,
    varlen_cases,
)
from suites.impls import TeFast, selected

BROAD_COUNT = {"cpu": 60, "cuda": 160}

MATRICES = {
    "core": lambda dev: core_matrix(dev),
    "broad": lambda dev: broad_matrix(dev, BROAD_COUNT[dev]),
    "thd_inference": lambda dev: thd_inference_cases(dev),
    "varlen": lambda dev: varlen_cases(dev),
}


def _params(config, matrix: str):
    params = []
    for adapter in selected(config):
        for dev in devices.DEVICES:
            for case in MATRICES[matrix](dev):
                marks = [pytest.mark.gpu] if dev == "cuda" else []
                params.append(
                    pytest.param(adapter, case, id=f"{case.id}-{adapter.name}", marks=marks)
                )
    return params


def pytest_generate_tests(metafunc):
    matrix = metafunc.definition.get_closest_marker("matrix")
    if matrix is not None:
        metafunc.parametrize("adapter,case", _params(metafunc.config, *matrix.args))


@pytest.mark.matrix("core")
def test_core(adapter, case):
    """Contract layouts x dtypes x {no_mask, causal, padding_causal, causal_bottom_right} x
    {MHA, GQA}; GQA on a qkv-packed layout is inexpressible and skips with that reason."""
    if case.invalid_reason():
        record.case(impl=adapter.name, **case.fields())
        pytest.skip(case.invalid_reason())
    check_case(adapter, case)


@pytest.mark.matrix("broad")
def test_broad(adapter, case):
    """A deterministic sample over every layout, mask, bias, softmax type, window and shape."""
    check_case(adapter, case)


@pytest.mark.matrix("thd_inference")
def test_thd_inference(adapter, case):
    """q in thd with a kv cache in bshd/sbhd longer than its filled lengths."""
    check_case(adapter, case)


@pytest.mark.matrix("varlen")
def test_varlen(adapter, case):
    """Ragged batches: random, zero-length, one full sequence, tokens past cu_seqlens_q[-1]."""
    check_case(adapter, case)


# ----------------------------------------------------------------------------- dropout (te_fast)


def _dropout_setup(device_name, p, sq=64, skv=512, seed=0):
    """q = k = 0 makes P uniform (1/skv), so with v = 1 each output counts the kept columns."""
    from te_fast import UnfusedDotProductAttention

    record.case(impl="te_fast", layout="bshd_bshd_bshd", dtype="fp32", mask_type="no_mask",
                device=device_name, dropout=p)  # fmt: skip
    device = devices.require(device_name)
    b, h, d = 2, 4, 8
    q = torch.zeros(b, sq, h, d, device=device)
    k = torch.zeros(b, skv, h, d, device=device)
    v = torch.ones(b, skv, h, d, device=device)
    module = UnfusedDotProductAttention(None, attention_dropout=p).train()
    return module, q, k, v


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("p", (0.1, 0.3))
def test_dropout_statistics(device_name, p):
    """Kept fraction ~ 1 - p and the mean is preserved, within 6 binomial standard deviations."""
    module, q, k, v = _dropout_setup(device_name, p)
    out = module(q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
    skv = k.shape[1]
    kept = out.double() * (1 - p) * skv  # kept columns per (row, head, dim): whole numbers
    assert torch.allclose(kept, kept.round(), atol=1e-3), (
        "dropout must scale kept values by 1/(1-p)"
    )
    n = kept[..., 0].numel() * skv  # Bernoulli draws behind the measurement
    fraction = kept[..., 0].sum().item() / n
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(fraction - (1 - p)) < 6 * sigma, f"kept fraction {fraction:.4f}, expected {1 - p}"
    mean = out.double().mean().item()
    assert abs(mean - 1.0) < 6 * sigma / (1 - p), f"mean {mean:.4f} not preserved (expected 1)"


@pytest.mark.parametrize("device_name", devices.device_params())
def test_dropout_reproducible_and_backward_consistent(device_name):
    """Same seed -> same output; backward uses the forward's mask: <out, dO> == <v, dv>."""
    module, q, k, v = _dropout_setup(device_name, 0.25, sq=16, skv=40)
    v = torch.randn_like(v).requires_grad_()
    q = torch.randn_like(q)
    k = torch.randn_like(k)
    kw = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
    torch.manual_seed(1234)
    out1 = module(q, k, v, **kw)
    torch.manual_seed(1234)
    out2 = module(q, k, v, **kw)
    assert torch.equal(out1, out2), "dropout is not reproducible under a fixed seed"
    torch.manual_seed(4321)
    assert not torch.equal(out1, module(q, k, v, **kw)), "another seed gave the same mask"
    grad_out = torch.randn_like(out1)
    (dv,) = torch.autograd.grad(out1, v, grad_out)
    lhs = (out1.double() * grad_out.double()).sum()
    rhs = (v.detach().double() * dv.double()).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-4), (
        f"<out, dO> = {lhs.item()} but <v, dv> = {rhs.item()}"
    )


@pytest.mark.parametrize("device_name", devices.device_params())
def test_dropout_zero_is_identity(device_name):
    """attention_dropout=0 in training mode is bitwise the eval-mode result."""
    from te_fast import UnfusedDotProductAttention

    record.case(impl="te_fast", layout="sbhd_sbhd_sbhd", device=device_name, dropout=0.0)
    device = devices.require(device_name)
    q, k, v = (torch.randn(9, 2, 4, 16, device=device) for _ in range(3))
    module = UnfusedDotProductAttention(None, attention_dropout=0.0)
    kw = dict(qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="causal")
    assert torch.equal(module.train()(q, k, v, **kw), module.eval()(q, k, v, **kw))


# ----------------------------------------------------------------------------- invalid input


def _bad_arguments(device):
    q = torch.randn(2, 5, 4, 8, device=device)
    kv = torch.randn(2, 5, 2, 8, device=device)
    kv3 = torch.randn(2, 5, 3, 8, device=device)  # 4 query heads cannot share 3 kv heads
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    t = torch.randn(5, 4, 8, device=device)
    base = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
    return {
        "unknown_layout": ((q, kv, kv), dict(base, qkv_layout="bshd_bshd"), "unknown qkv_layout"),
        "unknown_mask": ((q, kv, kv), dict(base, attn_mask_type="slide"), "unknown attn_mask_type"),
        "heads": ((q, kv3, kv3), base, r"multiple of key/value heads"),
        "cu_dtype": ((t, t, t), dict(qkv_layout="thd_thd_thd", cu_seqlens_q=cu.long(),
                     cu_seqlens_kv=cu, max_seqlen_q=3, max_seqlen_kv=3), "int32"),
        "cu_shape": ((t, t, t), dict(qkv_layout="thd_thd_thd", cu_seqlens_q=cu[None],
                     cu_seqlens_kv=cu, max_seqlen_q=3, max_seqlen_kv=3), r"\[b \+ 1\]"),
        "thd_max_seqlen": ((t, t, t), dict(qkv_layout="thd_thd_thd", cu_seqlens_q=cu,
                           cu_seqlens_kv=cu), "max_seqlen_q is required"),
        "bias_missing": ((q, kv, kv), dict(base, core_attention_bias_type="post_scale_bias"),
                         "needs core_attention_bias"),
        "window_conflict": ((q, kv, kv), dict(base, attn_mask_type="causal", window_size=(2, 3)),
                            "conflicts with attn_mask_type"),
        "padding_no_lengths": ((q, kv, kv), dict(base, attn_mask_type="padding"),
                               "needs the sequence lengths"),
        "bias_shape": ((q, kv, kv), dict(base, core_attention_bias_type="pre_scale_bias",
                       core_attention_bias=torch.zeros(2, 4, 5, 4, device=device)),
                       "core_attention_bias must have shape"),
    }  # fmt: skip


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("case", [*_bad_arguments("meta"), "learnable_without_offset"])
def test_invalid_arguments(case, device_name):
    """te_fast and te_ref reject bad input with a ValueError naming the problem."""
    from te_fast import UnfusedDotProductAttention

    record.case(impl="te_fast", layout="-", mask_type=f"invalid:{case}", device=device_name)
    device = devices.require(device_name)
    if case == "learnable_without_offset":
        q = torch.randn(2, 5, 4, 8, device=device)
        module = UnfusedDotProductAttention(None, softmax_type="learnable")
        with pytest.raises(ValueError, match="needs softmax_offset"):
            module(q, q, q, qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
        return
    (q, k, v), kwargs, message = _bad_arguments(device)[case]
    with pytest.raises(ValueError, match=message):
        UnfusedDotProductAttention(None)(q, k, v, **kwargs)
    with pytest.raises(ValueError, match=message):
        te_ref.dot_product_attention(q, k, v, **kwargs)


# ----------------------------------------------------------------------------- host syncs (GPU)

SYNC_CASES = [
    AttnCase("thd_thd_thd", "bf16", "padding_causal", varlen="trailing"),
    AttnCase("thd_bshd_bshd", "bf16", "padding_causal_bottom_right", kv_cache_extra=5),
    AttnCase("bshd_bshd_bshd", "fp16", "padding", padding_from="mask", hg=2),
    AttnCase("sbh3d", "bf16", "causal", bias_type="alibi"),
    AttnCase("bs3hd", "bf16", "no_mask", softmax_type="learnable", offset_via="param"),
    AttnCase("sbhd_sbhd_sbhd", "bf16", "arbitrary", window=(4, 4), return_max_logit=True),
    AttnCase(
        "bshd_bs2hd",
        "fp16",
        "causal_bottom_right",
        skv=51,
        bias_type="post_scale_bias",
        bias_shape="1hss",
    ),  # fmt: skip
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", SYNC_CASES, ids=lambda c: c.id)
def test_no_host_sync(case):
    """The non-FP8 forward and backward make no host synchronisation."""
    adapter = TeFast()
    _, inputs = prepare(adapter, case)
    module = adapter.build(case, case.d**-0.5)
    contracts.assert_no_host_sync(lambda: run_impl(adapter, module, case, inputs))
