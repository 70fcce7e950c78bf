"""The semantics table's values through every selected adapter: ALiBi slopes and bias matrices,
pre- and post-scale bias, max_logit under masks, the sink softmax's denominators and the
softmax scale at 0, against literals typed by hand from Transformer Engine 2.20.2's formulas
(suites/checks/literal_values.py holds them, with TE's lines and how a value is observed).
te_ref itself against the same literals: suites/judge/test_te_ref.py."""

from __future__ import annotations

import pytest
import torch

from te_conformance.suites import devices
from te_conformance.suites.cases import DTYPES, AttnCase
from te_conformance.suites.checks.literal_values import (
    ALIBI_SHAPES,
    DISTANCES,
    DTYPE_NAMES,
    EXAMPLE_BIAS,
    EXAMPLE_K,
    EXAMPLE_Q,
    KEEP,
    LEARNABLE_OFFSETS,
    MAX_LOGIT,
    PAD_BIAS,
    PAD_LENGTHS,
    PAD_MAX_LOGIT,
    REF64_TOLERANCE,
    SCALES,
    SCORES,
    SINK_DENOMINATORS,
    SOFTMAX,
    USER_SLOPES,
    judge_pin,
    keep_mask,
    pin_inputs,
    reference_call,
    run_call,
    settle,
    slopes,
    softmax64,
    start_pin,
    within,
)
from te_conformance.suites.checks.numerics import K_BACKWARD, K_FORWARD, check_ratio

pytestmark = pytest.mark.usefixtures("one_thread")  # suites/plugin.py: tiny tensors, one thread

# ----------------------------------------------------------------------------- ALiBi


@pytest.mark.per_adapter(dtype_name=DTYPE_NAMES, device_name=devices.device_params())
def test_alibi_default_slopes(adapter, dtype_name, device_name):
    """The default slopes of h = 1..16 heads, as the probabilities of q = 0 under ALiBi on the
    3x4 bottom-right distances (no_mask, alignment by default bottom-right): softmax of
    -slope_h * |i - j + 1| per head, through the adapter and te_ref."""
    failures = []
    for h in range(1, 17):
        case = AttnCase("bshd_bshd_bshd", dtype_name, "no_mask", device=device_name, b=1,
                        sq=3, skv=4, h=h, hg=h, d=2, dv=4, bias_type="alibi")  # fmt: skip
        device = start_pin(adapter, case, "alibi_default_slopes")
        q, k, v = pin_inputs(case, None, None, device)
        dist = torch.tensor(DISTANCES[("3x4", "BR")], dtype=torch.float64)
        bias = -torch.tensor(slopes(h), dtype=torch.float64).view(1, h, 1, 1) * dist
        kwargs = dict(qkv_layout=case.layout, attn_mask_type="no_mask",
                      core_attention_bias_type="alibi")  # fmt: skip
        found = judge_pin(adapter, case, q, k, v, kwargs, 0.5, softmax64(bias).to(device))
        failures += within(f"h={h}", found)
    settle(adapter, case, failures)


@pytest.mark.per_adapter(
    slopes_from=("default", "user"), dtype_name=DTYPE_NAMES, device_name=devices.device_params()
)
def test_alibi_bias_matrix(adapter, slopes_from, dtype_name, device_name):
    """The ALiBi bias matrix of every shape in ALIBI_DISTANCES at both alignments
    (bottom_right_diagonal None and True: bottom-right; False: top-left), three heads, with
    the default slopes (2**-4, 2**-8, 2**-2) or user slopes [h] (1, 0.5, 0.25): the
    probabilities of q = 0 are softmax(-slope_h * distance)."""
    failures = []
    h = 3
    head_slopes = slopes(h) if slopes_from == "default" else list(USER_SLOPES)
    for shape in ALIBI_SHAPES:
        sq, skv = (int(n) for n in shape.split("x"))
        for diag in (None, True, False):
            alignment = "TL" if diag is False else "BR"
            case = AttnCase(
                "bshd_bshd_bshd", dtype_name, "no_mask", device=device_name, b=1, sq=sq,
                skv=skv, h=h, hg=h, d=2, dv=skv, bias_type="alibi",
                alibi_slopes="h" if slopes_from == "user" else None, bottom_right_diagonal=diag,
            )  # fmt: skip
            device = start_pin(adapter, case, "alibi_bias_matrix")
            q, k, v = pin_inputs(case, None, None, device)
            kwargs = dict(qkv_layout=case.layout, attn_mask_type="no_mask",
                          core_attention_bias_type="alibi")  # fmt: skip
            if diag is not None:
                kwargs["bottom_right_diagonal"] = diag
            if slopes_from == "user":
                kwargs["alibi_slopes"] = torch.tensor(USER_SLOPES, device=device)
            dist = torch.tensor(DISTANCES[(shape, alignment)], dtype=torch.float64)
            bias = -torch.tensor(head_slopes, dtype=torch.float64).view(1, h, 1, 1) * dist
            found = judge_pin(adapter, case, q, k, v, kwargs, 0.5, softmax64(bias).to(device))
            failures += within(f"{shape} bottom_right_diagonal={diag}", found)
    settle(adapter, case, failures)


# ----------------------------------------------------------------------------- bias, max_logit


EXAMPLE_ROWS = [
    pytest.param((bias_type, scale, mask), id=f"{bias_type}-scale{scale:g}-{mask}")
    for bias_type in ("no_bias", "pre_scale_bias", "post_scale_bias")
    for scale in SCALES
    for mask in KEEP
]


@pytest.mark.per_adapter(
    row=EXAMPLE_ROWS, dtype_name=DTYPE_NAMES, device_name=devices.device_params()
)
def test_bias_example(adapter, row, dtype_name, device_name):
    """The 2x3 example under each bias type, softmax scale (0.5, -0.5 and exactly 0: TE takes
    any float, it checks none) and mask: the probabilities are the literal scores' softmax over
    the kept positions (the literal SOFTMAX rows where typed), max_logit the literal MAX_LOGIT.
    A negative scale reverses the scores' order; at scale 0 pre_scale_bias leaves uniform rows
    and post_scale_bias the bias alone."""
    bias_type, scale, mask = row
    case = AttnCase("bshd_bshd_bshd", dtype_name, mask, device=device_name, b=1, sq=2, skv=3,
                    h=1, hg=1, d=2, dv=3, bias_type=bias_type, bias_shape="11ss",
                    return_max_logit=True)  # fmt: skip
    device = start_pin(adapter, case, "bias_example")
    q, k, v = pin_inputs(case, EXAMPLE_Q, EXAMPLE_K, device)
    kwargs = dict(qkv_layout=case.layout, attn_mask_type=mask)
    if bias_type != "no_bias":
        kwargs["core_attention_bias_type"] = bias_type
        kwargs["core_attention_bias"] = torch.tensor(
            EXAMPLE_BIAS, dtype=DTYPES[dtype_name], device=device
        ).view(1, 1, 2, 3)
    if mask == "arbitrary":
        kwargs["attention_mask"] = ~keep_mask(mask, device).view(1, 1, 2, 3)
    keep = keep_mask(mask, device)
    probs = softmax64(SCORES[(bias_type, scale)], keep.cpu()).view(1, 1, 2, 3).to(device)
    if (bias_type, scale) in SOFTMAX and mask == "no_mask":
        typed = torch.tensor(SOFTMAX[(bias_type, scale)], dtype=torch.float64, device=device)
        assert torch.allclose(probs[0, 0], typed, rtol=1e-15, atol=0)
        probs = typed.view(1, 1, 2, 3)
    max_logit = torch.tensor([MAX_LOGIT[(bias_type, scale)][mask]], dtype=torch.float64,
                             device=device)  # fmt: skip
    failures = judge_pin(adapter, case, q, k, v, kwargs, scale, probs, max_logit)
    settle(adapter, case, failures, kwargs)


@pytest.mark.per_adapter(dtype_name=DTYPE_NAMES, device_name=devices.device_params())
def test_max_logit_over_batch_with_padding(adapter, dtype_name, device_name):
    """max_logit is the max over the batch of the unmasked scores: padding rows and columns
    holding the largest scores (9) do not count, and each head's max comes from a different
    batch element (q = 0, post_scale_bias: S = PAD_BIAS)."""
    case = AttnCase("bshd_bshd_bshd", dtype_name, "padding", device=device_name, b=2, sq=2,
                    skv=3, h=2, hg=2, d=2, dv=3, bias_type="post_scale_bias",
                    bias_shape="bhss", return_max_logit=True)  # fmt: skip
    device = start_pin(adapter, case, "max_logit_padding")
    q, k, v = pin_inputs(case, None, None, device)
    cu_q, cu_kv = ([0, *[sum(n[: i + 1]) for i in range(2)]] for n in PAD_LENGTHS)
    bias = torch.tensor(PAD_BIAS, dtype=torch.float64)
    kwargs = dict(
        qkv_layout=case.layout, attn_mask_type="padding",
        core_attention_bias_type="post_scale_bias",
        core_attention_bias=bias.to(device=device, dtype=DTYPES[dtype_name]),
        cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
        cu_seqlens_kv=torch.tensor(cu_kv, dtype=torch.int32, device=device),
    )  # fmt: skip
    keep = torch.ones(2, 1, 2, 3, dtype=torch.bool)
    keep[1, :, 1, :] = False  # batch element 1: query 1 and key 2 are padding
    keep[1, :, :, 2] = False
    probs = softmax64(bias, keep).masked_fill(~keep.any(-1, keepdim=True), 0.0)
    max_logit = torch.tensor(PAD_MAX_LOGIT, dtype=torch.float64, device=device)
    failures = judge_pin(adapter, case, q, k, v, kwargs, 0.5, probs.to(device), max_logit)
    settle(adapter, case, failures, kwargs)


# ----------------------------------------------------------------------------- the sink


SINK_ROWS = [
    pytest.param((softmax_type, mask), id=f"{softmax_type}-{mask}")
    for softmax_type in ("off-by-one", "learnable")
    for mask in ("no_mask", "causal")
]


@pytest.mark.per_adapter(row=SINK_ROWS, dtype_name=DTYPE_NAMES,
                         device_name=devices.device_params())  # fmt: skip
def test_sink_denominators(adapter, row, dtype_name, device_name):
    """The sink softmax on the post_scale_bias example at scale 0.5, two heads: each kept
    probability is exp(s_j) / D with D the literal SINK_DENOMINATORS (offset 0 for off-by-one;
    softmax_offset (-1, 2) for learnable), masked positions 0."""
    softmax_type, mask = row
    case = AttnCase("bshd_bshd_bshd", dtype_name, mask, device=device_name, b=1, sq=2, skv=3,
                    h=2, hg=2, d=2, dv=3, bias_type="post_scale_bias", bias_shape="11ss",
                    softmax_type=softmax_type)  # fmt: skip
    device = start_pin(adapter, case, "sink_denominators")
    q, k, v = pin_inputs(case, EXAMPLE_Q, EXAMPLE_K, device)
    kwargs = dict(
        qkv_layout=case.layout, attn_mask_type=mask, core_attention_bias_type="post_scale_bias",
        core_attention_bias=torch.tensor(EXAMPLE_BIAS, dtype=DTYPES[dtype_name],
                                         device=device).view(1, 1, 2, 3),
    )  # fmt: skip
    offsets = (0.0, 0.0) if softmax_type == "off-by-one" else LEARNABLE_OFFSETS
    if softmax_type == "learnable":
        kwargs["softmax_offset"] = torch.tensor(offsets, dtype=torch.float32, device=device)
    scores = torch.tensor(SCORES[("post_scale_bias", 0.5)], dtype=torch.float64)
    keep = keep_mask(mask, "cpu")
    probs = torch.zeros(1, 2, 2, 3, dtype=torch.float64)
    for head, offset in enumerate(offsets):
        den = torch.tensor(SINK_DENOMINATORS[(mask, offset)], dtype=torch.float64).view(2, 1)
        probs[0, head] = torch.where(keep, scores.exp() / den, 0.0)
    failures = judge_pin(adapter, case, q, k, v, kwargs, 0.5, probs.to(device))
    settle(adapter, case, failures, kwargs)


# ----------------------------------------------------------------------------- scale 0


@pytest.mark.per_adapter(
    mask=("no_mask", "causal", "causal_bottom_right"), dtype_name=DTYPE_NAMES,
    device_name=devices.device_params(),
)  # fmt: skip
def test_scale_zero_gradients(adapter, mask, dtype_name, device_name):
    """softmax_scale exactly 0 with random q, k, v and dO (the 2x3 masks of KEEP, two batch
    elements, two heads): the attention is uniform over the kept keys (P = 1/n there, the
    literal), so out = P V, dv = P^T dO, and no gradient reaches q or k (dq = dk = 0: the scores
    do not depend on them). SPEC §6 against those float64 products of the literal P, the bound
    from te_ref's same-precision composite; te_ref float64 to REF64_TOLERANCE."""
    case = AttnCase("bshd_bshd_bshd", dtype_name, mask, device=device_name, b=2, sq=2, skv=3,
                    h=2, hg=2, d=4, dv=5)  # fmt: skip
    device = start_pin(adapter, case, "scale_zero")
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(7)

    def randn(*shape, magnitude=1.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * magnitude).to(dtype)

    leaves = {"q": randn(2, 2, 2, 4, magnitude=8.0), "k": randn(2, 3, 2, 4, magnitude=8.0),
              "v": randn(2, 3, 2, 5)}  # fmt: skip
    d_out = randn(2, 2, 10).to(device)
    kwargs = dict(qkv_layout=case.layout, attn_mask_type=mask)

    def grads(run, compute_dtype=None):
        ts = {n: t.to(device=device, dtype=compute_dtype or dtype).requires_grad_()
              for n, t in leaves.items()}  # fmt: skip
        out = run(ts["q"], ts["k"], ts["v"])
        got = torch.autograd.grad(out, list(ts.values()), d_out.to(out.dtype))
        return {"out": out.detach(), **{f"d{n}": g for n, g in zip(ts, got)}}

    keep = keep_mask(mask, "cpu").double()
    probs = (keep / keep.sum(-1, keepdim=True)).view(1, 1, 2, 3)  # the literal: 1/n where kept
    v64 = leaves["v"].double().permute(0, 2, 1, 3)  # (b, h, skv, dv)
    do64 = d_out.cpu().double().view(2, 2, 2, 5).permute(0, 2, 1, 3)  # (b, h, sq, dv)
    want = {
        "out": (probs @ v64).permute(0, 2, 1, 3).reshape(2, 2, 10),
        "dq": torch.zeros(2, 2, 2, 4, dtype=torch.float64),
        "dk": torch.zeros(2, 3, 2, 4, dtype=torch.float64),
        "dv": (probs.transpose(-2, -1) @ do64).permute(0, 2, 1, 3),
    }
    want = {n: t.to(device) for n, t in want.items()}

    def ref(compute):
        return lambda q, k, v: reference_call(compute, case, q, k, v, kwargs, 0.0)[0]

    failures = []
    ref64 = grads(ref("float64"), torch.float64)
    ref_lp = grads(ref("same_precision"))
    for name, t in ref64.items():
        err = (t - want[name]).abs().max().item()
        if err > REF64_TOLERANCE:
            failures.append(AssertionError(f"te_ref float64 {name}: off the literal by {err:.3g}"))
    impl = grads(lambda q, k, v: run_call(adapter, case, q, k, v, kwargs, 0.0)[0])
    for name, t in impl.items():
        try:
            k_rule = K_FORWARD if name == "out" else K_BACKWARD
            check_ratio(name, t, want[name], ref_lp[name], k_rule, dtype)
        except AssertionError as e:
            failures.append(e)
    settle(adapter, case, failures, kwargs)
