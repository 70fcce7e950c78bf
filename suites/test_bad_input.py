"""Bad input, nothing lost: every argument rule of the ops and of the module raises a
ValueError/RuntimeError whose message names the argument, the form it expects and what it got
(dtype and shape for a tensor); on CUDA, bad cu_seqlens values raise the CPU's message under
TE_FAST_DEBUG_CHECKS=1 and are NaN-poisoned without a host sync otherwise. Two meta-tests hold
the tables complete: every check in csrc/checks.h and every raise in te_fast's Python must be hit
by a case here (or in suites/op_cases.py's tables).

The ops are te_fast's; the module rules run through every selected adapter that declares
`validates_arguments` (the others skip with their reason): the rules of the resolved call through
the adapter's own build and call, te_fast's constructor, attribute and FP8 rules on te_fast."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

import te_fast
import te_ref
from reports import record
from suites import devices
from suites.adapters import require
from suites.cases import AttnCase
from suites.checks import contracts
from suites.fuzz.checks import poisoned_rows
from suites.op_cases import BAD_CU_SEQLENS, bad_op_calls, bad_op_values
from te_fast import ops as fast
from te_fast.fp8 import CurrentScaling, DelayedScaling

ROOT = Path(__file__).resolve().parents[1]
DEVICES = devices.device_params()




def _record(what: str, device_name: str) -> None:
    record.case(impl="te_fast", layout="bad_input", mask_type=what, device=device_name)


def _message(fn) -> str:
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return str(e).split("\n")[0]
    raise AssertionError("no error")


# ----------------------------------------------------------------------------- ops


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("case", list(bad_op_values("meta")))
def test_op_bad_values(case, device_name, monkeypatch):
    """max_seqlen or num_tokens too small for the lengths: a RuntimeError naming the op and the
    argument (CUDA: under TE_FAST_DEBUG_CHECKS=1)."""
    _record(f"op_value:{case}", device_name)
    device = devices.require(device_name)
    monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    fn, message = bad_op_values(device)[case]
    with pytest.raises(RuntimeError, match=f"te_fast: {message}"):
        fn()


def _device_mismatch_calls(cuda):
    """case -> (call, message): one argument on the other device."""
    x = torch.randn(2, 3, 5, 7, device=cuda)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    return {
        "mask_on_cpu": (
            lambda: fast.scaled_masked_softmax(x, torch.zeros(1, 1, 5, 7, dtype=torch.bool), 1.0),
            r"scaled_masked_softmax_fwd expects mask on cuda:\d like x, got cpu",
        ),
        "x_on_cpu": (
            lambda: fast.scaled_masked_softmax(
                x.cpu(), torch.zeros(1, 1, 5, 7, dtype=torch.bool, device=cuda), 1.0
            ),
            r"scaled_masked_softmax_fwd expects mask on cpu like x, got cuda:\d",
        ),
        "dy_on_cpu": (
            lambda: fast.scaled_softmax_bwd(x.cpu(), x, 1.0),
            r"scaled_softmax_bwd expects dy and y on one device, got cpu and cuda:\d",
        ),
        "cu_seqlens_on_cpu": (
            lambda: fast.convert_thd_to_bshd(torch.randn(5, 2, 3, device=cuda), cu, 2, 3),
            r"convert_thd_to_bshd expects cu_seqlens on cuda:\d like the data, got cpu",
        ),
        "cu_seqlens_on_cuda": (
            lambda: fast.convert_bshd_to_thd(torch.randn(2, 3, 2, 3), cu.to(cuda), 5),
            r"convert_bshd_to_thd expects cu_seqlens on cpu like the data, got cuda:\d",
        ),
    }


DEVICE_MISMATCH = list(_device_mismatch_calls("meta"))


@pytest.mark.gpu
@pytest.mark.parametrize("case", DEVICE_MISMATCH)
def test_op_device_mismatch(case):
    _record(f"device_mismatch:{case}", "cuda")
    device = devices.require("cuda")
    fn, message = _device_mismatch_calls(device)[case]
    with pytest.raises(RuntimeError, match=f"te_fast: {message}"):
        fn()


def _bad_cu_call(case: str, op: str, device):
    cu_list, b, max_seqlen, t, _ = BAD_CU_SEQLENS[case]
    gen = torch.Generator().manual_seed(len(case))
    cu = torch.tensor(cu_list, dtype=torch.int32, device=device)
    if op == "convert_thd_to_bshd":
        args = (torch.randn(t, 2, 3, generator=gen).to(device), cu, b, max_seqlen)
    else:
        args = (torch.randn(b, max_seqlen, 2, 3, generator=gen).to(device), cu, t)
    return args, cu_list


CONVERSIONS = ["convert_thd_to_bshd", "convert_bshd_to_thd"]


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONVERSIONS)
@pytest.mark.parametrize("case", list(BAD_CU_SEQLENS))
def test_debug_checks_raise_the_cpu_message(case, op, monkeypatch):
    """TE_FAST_DEBUG_CHECKS=1 on CUDA: bad cu_seqlens values raise exactly the CPU's message."""
    _record(f"debug_checks:{case}:{op}", "cuda")
    device = devices.require("cuda")
    args, _ = _bad_cu_call(case, op, device)
    cpu_args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
    cpu_message = _message(lambda: getattr(fast, op)(*cpu_args))
    monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    assert _message(lambda: getattr(fast, op)(*args)) == cpu_message


@pytest.mark.gpu
@pytest.mark.parametrize("op", CONVERSIONS)
@pytest.mark.parametrize("case", list(BAD_CU_SEQLENS))
def test_bad_cu_seqlens_poison_without_host_sync(case, op, monkeypatch):
    """Without TE_FAST_DEBUG_CHECKS on CUDA: no error and no host sync (sync debug mode
    'error'); exactly the rows the kernels' rule marks are NaN, every other row is what the
    conversion gives for the usable sequences (copies and zeros)."""
    _record(f"poison:{case}:{op}", "cuda")
    device = devices.require("cuda")
    monkeypatch.delenv("TE_FAST_DEBUG_CHECKS", raising=False)
    args, cu = _bad_cu_call(case, op, device)
    outs = []
    contracts.assert_no_host_sync(lambda: outs.append(getattr(fast, op)(*args)))
    out = outs[0].cpu()
    nan_rows = torch.isnan(out).flatten(start_dim=-2).any(-1)
    expected = poisoned_rows(op, args, cu)
    assert torch.equal(nan_rows, expected), (nan_rows, expected)
    assert expected.any(), "the case poisons nothing: it tests nothing"
    data = args[0].cpu()
    for index in (~expected).nonzero().tolist():  # the rows that are not poisoned
        if op == "convert_thd_to_bshd":
            x, s = index
            length = cu[x + 1] - cu[x]
            want = data[cu[x] + s] if s < length else torch.zeros_like(data[0])
        else:
            (r,) = index
            if r >= cu[-1]:
                want = torch.zeros_like(data[0, 0])
            else:
                x = max(i for i in range(len(cu) - 1) if cu[i] <= r)
                want = data[x, r - cu[x]]
        assert torch.equal(out[tuple(index)], want), index


@pytest.mark.gpu
def test_module_bad_cu_seqlens_on_cuda(monkeypatch):
    """The module on thd with a non-monotone cu_seqlens_q: with TE_FAST_DEBUG_CHECKS=1 the CPU's
    error; without, a NaN output and no host sync."""
    _record("module_bad_cu_seqlens", "cuda")
    device = devices.require("cuda")

    def inputs(dev):
        t = torch.randn(8, 2, 16, generator=torch.Generator().manual_seed(0)).to(dev)
        return t, torch.tensor([0, 5, 3, 8], dtype=torch.int32, device=dev)

    def call(t, cu):
        attn = te_fast.UnfusedDotProductAttention(0.25)
        return attn(t, t, t, qkv_layout="thd_thd_thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                    max_seqlen_q=5, max_seqlen_kv=5, attn_mask_type="padding_causal")  # fmt: skip

    cpu_message = _message(lambda: call(*inputs("cpu")))
    assert "te_fast: convert_thd_to_bshd expects non-decreasing cu_seqlens" in cpu_message
    cuda_inputs = inputs(device)  # built outside the sync check (a host-to-device copy syncs)
    monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    assert _message(lambda: call(*cuda_inputs)) == cpu_message
    monkeypatch.delenv("TE_FAST_DEBUG_CHECKS")
    outs = []
    contracts.assert_no_host_sync(lambda: outs.append(call(*cuda_inputs)))
    assert torch.isnan(outs[0]).any(), "bad cu_seqlens_q must be visible in the output (NaN)"


def _checks_h_literals() -> list[str]:
    """The longest string literal of each TORCH_CHECK message in csrc/checks.h."""
    text = (ROOT / "csrc" / "checks.h").read_text()
    found = []
    for m in re.finditer(r"TORCH_CHECK\((.*?)\);", text, re.S):
        literals = [s for s in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)) if s != "te_fast: "]
        found.append(max(literals, key=len))
    return found


# Checks that need two devices: hit by test_op_device_mismatch on a GPU.
DEVICE_CHECKS = (
    " expects mask on ",
    " expects dy and y on one device, got ",
    " expects cu_seqlens on ",
)


def test_every_op_check_is_exercised():
    """Each TORCH_CHECK of csrc/checks.h is raised by at least one case of the tables (on the
    CPU here; the device checks by the GPU's device-mismatch cases, whose messages are checked
    against them)."""
    device = devices.require("cpu")
    messages = [_message(fn) for fn, _ in bad_op_calls(device).values()]
    messages += [_message(fn) for fn, _ in bad_op_values(device).values()]
    for case in BAD_CU_SEQLENS:
        for op in CONVERSIONS:
            args, _ = _bad_cu_call(case, op, device)
            try:
                getattr(fast, op)(*args)
            except RuntimeError as e:
                messages.append(str(e))
    device_messages = [m for _, m in _device_mismatch_calls("meta").values()]
    missing = []
    for literal in _checks_h_literals():
        if literal in DEVICE_CHECKS:
            if not any(literal in m for m in device_messages):
                missing.append(literal)
        elif not any(literal.replace('\\"', '"') in m for m in messages):
            missing.append(literal)
    assert not missing, f"checks of csrc/checks.h that no case raises: {missing}"
    assert len(_checks_h_literals()) >= 20, "the TORCH_CHECK parser found too few checks"


# ----------------------------------------------------------------------------- the module


def _module_problems(device):
    """problem -> (module constructor kwargs, (q, k, v), forward kwargs, exception, message,
    whether te_ref has the same rule). Each breaks exactly one rule of te_fast/_call.py,
    te_fast/attention.py or te_fast/fp8.py."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=g).to(device)

    q, kv = randn(2, 5, 4, 8), randn(2, 5, 2, 8)
    t, t2 = randn(5, 4, 8), randn(5, 2, 8)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    cu2 = torch.tensor([0, 1, 5], dtype=torch.int32, device=device)  # lengths 1, 4
    pad = torch.zeros(2, 1, 1, 5, dtype=torch.bool, device=device)

    def bad_batch(*shape):  # a bool mask of this shape, one position masked
        mask = torch.zeros(shape, dtype=torch.bool, device=device)
        mask[..., 0] = True
        return mask

    base = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
    thd = dict(qkv_layout="thd_thd_thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=3,
               max_seqlen_kv=3, attn_mask_type="padding")  # fmt: skip
    qkv = (q, kv, kv)
    fp8 = {"recipe": DelayedScaling()}
    V = ValueError
    return {
        # constructor
        "ctor_softmax_type": (dict(softmax_type="sink"), qkv, base, V,
                              "unknown softmax_type 'sink'; expected one of", False),
        "ctor_attention_type": (dict(attention_type="both"), qkv, base, V,
                                "attention_type must be 'self' or 'cross', got 'both'", False),
        "ctor_dropout": (dict(attention_dropout=1.0), qkv, base, V,
                         r"attention_dropout must be in \[0, 1\), got 1.0", False),
        "ctor_score_chunk_bytes": (dict(score_chunk_bytes=0), qkv, base, V,
                                   "score_chunk_bytes must be a positive int or None, got 0",
                                   False),
        # the resolved call (te_ref has each of these rules, with the same message)
        "unknown_layout": ({}, qkv, dict(base, qkv_layout="bshd_bshd"), V,
                           "unknown qkv_layout 'bshd_bshd'; expected one of", True),
        "unknown_mask": ({}, qkv, dict(base, attn_mask_type="slide"), V,
                         "unknown attn_mask_type 'slide'; expected one of", True),
        "unknown_bias": ({}, qkv, dict(base, core_attention_bias_type="bias"), V,
                         "unknown core_attention_bias_type 'bias'; expected one of", True),
        "module_softmax_type": ({"_softmax_type": "sink"}, qkv, base, V,
                                "unknown softmax_type 'sink'; expected one of", True),
        "module_attention_type": ({"_attention_type": "both"}, qkv, base, V,
                                  "attention_type must be 'self' or 'cross'", True),
        "q_rank": ({}, (q[0], kv, kv), base, V, r"query_layer in bshd must be 4-D, got shape "
                   r"\(5, 4, 8\)", True),
        "k_rank": ({}, (q, kv[0], kv), base, V, "key_layer in bshd must be 4-D", True),
        "v_rank": ({}, (t, t2, t2[None]), dict(thd, cu_seqlens_kv=cu), V,
                   "value_layer in thd must be 3-D", True),
        "head_dims": ({}, (q, kv[..., :4], kv), base, V,
                      "query and key head dims differ: 8 vs 4", True),
        "kv_disagree": ({}, (q, kv, kv[:, :4]), base, V, r"key_layer \(2, 5, 2, 8\) and "
                        r"value_layer \(2, 4, 2, 8\) must agree in everything but the head dim",
                        True),
        "heads": ({}, (q, randn(2, 5, 3, 8), randn(2, 5, 3, 8)), base, V,
                  r"query heads \(4\) must be a multiple of key/value heads \(3\)", True),
        "dtypes": ({}, (q, kv.double(), kv.double()), base, V,
                   "query/key/value dtypes differ: torch.float32, torch.float64", True),
        # te_fast takes its ops' three dtypes; te_ref float64 too (its golden answer's inputs)
        "q_int64": ({}, (q.long(), kv.long(), kv.long()), base, V,
                    r"query_layer must have dtype torch.float16, torch.bfloat16,? .*or "
                    r"torch.float(32|64) \(key_layer and value_layer share it\), got torch.int64 "
                    r"\(2, 5, 4, 8\)", True),
        "batches": ({}, (q, kv[:1], kv[:1]), base, V,
                    r"query batch \(2\) and key/value batch \(1\) differ", True),
        "needs_cu_q": ({}, (t, t2, t2), dict(thd, cu_seqlens_q=None), V,
                       r"qkv_layout 'thd_thd_thd' needs cu_seqlens_q \(int32 \[b \+ 1\]\)", True),
        "needs_cu_kv": ({}, (t, t2, t2), dict(thd, cu_seqlens_kv=None), V,
                        r"qkv_layout 'thd_thd_thd' needs cu_seqlens_kv \(int32", True),
        "needs_cache_lengths": ({}, (t, kv, kv), dict(thd, qkv_layout="thd_bshd_bshd",
                                cu_seqlens_kv=None), V,
                                "needs cu_seqlens_kv: the filled length of each sequence", True),
        "cu_not_tensor": ({}, (t, t2, t2), dict(thd, cu_seqlens_q=[0, 3, 5]), V,
                          r"cu_seqlens_q must be an int32 tensor of shape \[b \+ 1\], got list",
                          True),
        "cu_int64": ({}, (t, t2, t2), dict(thd, cu_seqlens_q=cu.long()), V,
                     r"cu_seqlens_q must be an int32 tensor of shape \[b \+ 1\], got torch.int64",
                     True),
        "cu_float": ({}, (t, t2, t2), dict(thd, cu_seqlens_kv=cu.float()), V,
                     r"cu_seqlens_kv must be an int32 tensor of shape \[b \+ 1\], got "
                     "torch.float32", True),
        "cache_cu_shape": ({}, (t, kv, kv), dict(thd, qkv_layout="thd_bshd_bshd",
                           cu_seqlens_kv=cu[:2]), V,
                           r"cu_seqlens_kv must have shape \[b \+ 1\] = \[3\], got \(2,\)", True),
        "max_seqlen_missing": ({}, (t, t2, t2), dict(thd, max_seqlen_q=None), V,
                               "max_seqlen_q is required for the thd format of query_layer",
                               True),
        "max_seqlen_negative": ({}, (t, t2, t2), dict(thd, max_seqlen_kv=-1), V,
                                "max_seqlen_kv must be a non-negative plain int, got -1", True),
        "max_seqlen_tensor": ({}, (t, t2, t2), dict(thd, max_seqlen_q=torch.tensor(3)), V,
                              "max_seqlen_q must be a non-negative plain int, got tensor", True),
        # a sequence longer than max_seqlen: the module names its argument, not the op
        # (CUDA: under TE_FAST_DEBUG_CHECKS=1, VALUE_PROBLEMS)
        "max_seqlen_q_short": ({}, (t, t2, t2), dict(thd, max_seqlen_q=2), V,
                               r"max_seqlen_q must be at least the longest sequence of "
                               r"cu_seqlens_q, got max_seqlen_q = 2 < 3, the length of sequence 0",
                               True),
        "max_seqlen_kv_short": ({}, (t, t2, t2), dict(thd, cu_seqlens_kv=cu2, max_seqlen_kv=3), V,
                                r"max_seqlen_kv must be at least the longest sequence of "
                                r"cu_seqlens_kv, got max_seqlen_kv = 3 < 4, the length of "
                                r"sequence 1", True),
        "padding_no_lengths": ({}, qkv, dict(base, attn_mask_type="padding"), V,
                               "attn_mask_type='padding' needs the sequence lengths", True),
        "padding_cross_no_cu_kv": ({}, (q, kv[:, :3], kv[:, :3]),
                                   dict(base, attn_mask_type="padding", cu_seqlens_q=cu), V,
                                   "cross attention with padding needs cu_seqlens_kv as well",
                                   True),
        "padding_cu_shape": ({}, qkv, dict(base, attn_mask_type="padding",
                             cu_seqlens_q=cu[:2]), V,
                             r"cu_seqlens_q must have shape \[b \+ 1\] = \[3\]", True),
        "padding_mask_not_pair": ({}, (q, kv[:, :3], kv[:, :3]),
                                  dict(base, attn_mask_type="padding", attention_mask=pad), V,
                                  r"sq \(5\) != skv \(3\): padding needs attention_mask as a pair",
                                  True),
        "padding_mask_triple": ({}, (q, kv[:, :3], kv[:, :3]),
                                dict(base, attn_mask_type="padding",
                                     attention_mask=(pad, pad, pad)), V,
                                r"attention_mask for cross attention is a pair", True),
        "padding_mask_dtype": ({}, qkv, dict(base, attn_mask_type="padding",
                               attention_mask=pad.float()), V,
                               r"padding attention_mask \(q\) must be torch.bool \[2, 1, 1, 5\], "
                               r"got torch.float32 \(2, 1, 1, 5\)", True),
        "padding_mask_int32": ({}, qkv, dict(base, attn_mask_type="padding",
                               attention_mask=pad.int()), V,
                               r"padding attention_mask \(q\) must be torch.bool \[2, 1, 1, 5\], "
                               r"got torch.int32 \(2, 1, 1, 5\)", True),
        "padding_mask_shape": ({}, qkv, dict(base, attn_mask_type="padding",
                               attention_mask=pad[..., :4]), V,
                               r"padding attention_mask \(q\) must be torch.bool \[2, 1, 1, 5\], "
                               r"got torch.bool \(2, 1, 1, 4\)", True),
        "padding_mask_not_tensor": ({}, qkv, dict(base, attn_mask_type="padding",
                                    attention_mask=[[False] * 5] * 2), V,
                                    r"padding attention_mask \(q\) must be torch.bool "
                                    r"\[2, 1, 1, 5\], got list", True),
        "arbitrary_no_mask": ({}, qkv, dict(base, attn_mask_type="arbitrary"), V,
                              "attn_mask_type='arbitrary' needs attention_mask: a bool tensor",
                              True),
        "arbitrary_float_mask": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                                 attention_mask=torch.zeros(2, 4, 5, 5, device=device)), V,
                                 r"attention_mask for attn_mask_type='arbitrary' must be "
                                 r"torch.bool \(True = masked\), got torch.float32 "
                                 r"\(2, 4, 5, 5\)", True),
        "arbitrary_shape": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                            attention_mask=pad.expand(2, 1, 5, 5)[:, :, :, :4]), V,
                            r"does not broadcast to \[b, h, sq, skv\] = \[2, 4, 5, 5\]", True),
        # a batch that is neither 1 nor b (3 for b = 2), for each argument with a batch axis
        "arbitrary_mask_batch": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                                 attention_mask=bad_batch(3, 4, 5, 5)), V,
                                 r"attention_mask of shape \(3, 4, 5, 5\) does not broadcast to "
                                 r"\[b, h, sq, skv\] = \[2, 4, 5, 5\]", True),
        "arbitrary_mask_batch_1h": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                                    attention_mask=bad_batch(3, 1, 5, 5)), V,
                                    r"attention_mask of shape \(3, 1, 5, 5\) does not broadcast",
                                    True),
        "padding_mask_batch": ({}, qkv, dict(base, attn_mask_type="padding",
                               attention_mask=bad_batch(3, 1, 1, 5)), V,
                               r"padding attention_mask \(q\) must be torch.bool \[2, 1, 1, 5\], "
                               r"got torch.bool \(3, 1, 1, 5\)", True),
        "padding_kv_mask_batch": ({}, (q[:, :3], kv, kv),
                                  dict(base, attn_mask_type="padding",
                                       attention_mask=(pad[..., :3], bad_batch(3, 1, 1, 5))), V,
                                  r"padding attention_mask \(kv\) must be torch.bool "
                                  r"\[2, 1, 1, 5\], got torch.bool \(3, 1, 1, 5\)", True),
        "bias_batch": ({}, qkv, dict(base, core_attention_bias_type="post_scale_bias",
                       core_attention_bias=randn(3, 4, 5, 5)), V,
                       r"core_attention_bias must have shape \[b\|1, h\|1, sq\|1, skv\] = "
                       r"\[2\|1, 4\|1, 5\|1, 5\], got \(3, 4, 5, 5\)", True),
        "slopes_batch": ({}, qkv, dict(base, core_attention_bias_type="alibi",
                         alibi_slopes=randn(3, 4)), V,
                         r"alibi_slopes must have shape \[4\] or \[2, 4\], got \(3, 4\)", True),
        "arbitrary_rank": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                           attention_mask=pad[0, 0]), V, r"attention_mask must be 4-D, got "
                           r"\(1, 5\)", True),
        "mask_with_causal": ({}, qkv, dict(base, attn_mask_type="causal", attention_mask=pad), V,
                             "attention_mask is only used with padding\\* and 'arbitrary' mask "
                             "types, not 'causal'", True),
        "thd_with_mask": ({}, (t, t2, t2), dict(thd, attention_mask=pad), V,
                          "thd layouts take sequence lengths from cu_seqlens, not "
                          "attention_mask", True),
        "bias_missing": ({}, qkv, dict(base, core_attention_bias_type="post_scale_bias"), V,
                         "core_attention_bias_type='post_scale_bias' needs core_attention_bias",
                         True),
        "bias_shape": ({}, qkv, dict(base, core_attention_bias_type="pre_scale_bias",
                       core_attention_bias=randn(2, 4, 5, 4)), V,
                       r"core_attention_bias must have shape \[b\|1, h\|1, sq\|1, skv\] = "
                       r"\[2\|1, 4\|1, 5\|1, 5\], got \(2, 4, 5, 4\)", True),
        # TE's fused attention: "attn_bias tensor must have the same dtype as q and kv"
        # (cpp_extensions/fused_attn.py:340-344); its unfused path casts or fails (SEMANTICS.md)
        "bias_dtype": ({}, (q.half(), kv.half(), kv.half()),
                       dict(base, core_attention_bias_type="post_scale_bias",
                            core_attention_bias=randn(1, 4, 5, 5)), V,
                       r"core_attention_bias must have the dtype of query_layer, torch.float16, "
                       r"got torch.float32 \(1, 4, 5, 5\)", True),
        "bias_without_type": ({}, qkv, dict(base, core_attention_bias=randn(1, 1, 5, 5)), V,
                              "core_attention_bias given with core_attention_bias_type="
                              "'no_bias'", True),
        "slopes_without_alibi": ({}, qkv, dict(base, alibi_slopes=randn(4)), V,
                                 "alibi_slopes given without core_attention_bias_type='alibi'",
                                 True),
        "slopes_shape": ({}, qkv, dict(base, core_attention_bias_type="alibi",
                         alibi_slopes=randn(3)), V,
                         r"alibi_slopes must have shape \[4\] or \[2, 4\], got \(3,\)", True),
        "learnable_without_offset": (dict(softmax_type="learnable"), qkv, base, V,
                                     "softmax_type='learnable' needs softmax_offset", True),
        "offset_with_vanilla": ({}, qkv, dict(base, softmax_offset=randn(4)), V,
                                "softmax_offset given with softmax_type='vanilla'", True),
        "offset_shape": (dict(softmax_type="learnable"), qkv,
                         dict(base, softmax_offset=randn(2)), V,
                         r"softmax_offset must have shape \[4\] or \[1, 4, 1, 1\], got \(2,\)",
                         True),
        "window_not_pair": ({}, qkv, dict(base, window_size=3), V,
                            "window_size must be a pair of ints, got 3", True),
        # window_size as TE 2.20.2's check_set_window_size takes it (utils.py:2992-3034)
        "window_negative": ({}, qkv, dict(base, window_size=(-2, 0)), V,
                            r"window_size=\(-2, 0\) is not valid for attn_mask_type='no_mask': "
                            r"use \(-1, -1\) or \(>=0, >=0\)", True),
        "window_one_side": ({}, qkv, dict(base, window_size=(0, -1)), V,
                            r"window_size=\(0, -1\) is not valid for attn_mask_type='no_mask'",
                            True),
        "window_conflict": ({}, qkv, dict(base, attn_mask_type="causal", window_size=(-1, 3)), V,
                            r"window_size=\(-1, 3\) conflicts with attn_mask_type='causal': "
                            r"causal types take \(-1, 0\) or \(>=0, 0\)", True),
        # thd takes the padding types only (TE 2.20.2 dot_product_attention.py:2449-2452)
        "thd_causal": ({}, (t, t2, t2), dict(thd, attn_mask_type="causal"), V,
                       "attn_mask_type='causal' is not valid for qkv_layout 'thd_thd_thd': a thd "
                       "q takes padding, padding_causal or padding_causal_bottom_right", True),
        # FP8 (te_fast's own)
        "fp8_output_without_fp8": ({}, qkv, dict(base, fp8_output=True, fp8_meta=fp8), V,
                                   "fp8_output=True needs fp8=True", False),
        "fp8_without_recipe": ({}, qkv, dict(base, fp8=True), V,
                               "fp8=True needs fp8_meta=", False),
        "fp8_bad_recipe": ({}, qkv, dict(base, fp8=True, fp8_meta={"recipe": "hybrid"}), V,
                           r"fp8_meta\['recipe'\] must be te_fast.fp8.DelayedScaling or "
                           "CurrentScaling, got str", False),
        "fp8_unsupported": ({}, qkv, dict(base, fp8=True, fp8_meta={"recipe": CurrentScaling()},
                            core_attention_bias_type="post_scale_bias",
                            core_attention_bias=randn(1, 1, 5, 5)), NotImplementedError,
                            r"te_fast FP8 attention does not support \[\"core_attention_bias_"
                            "type='post_scale_bias'\"\\]", False),
    }  # fmt: skip


MODULE_PROBLEMS = list(_module_problems("meta"))
# Rules on cu_seqlens values: checked by the conversion op, on CUDA only under
# TE_FAST_DEBUG_CHECKS=1 (without it the rows are NaN-poisoned, with no host sync).
VALUE_PROBLEMS = ("max_seqlen_q_short", "max_seqlen_kv_short")


def _te_fast_only(problem: str) -> str | None:
    """Why a problem cannot run through any adapter (None when it can): te_fast's constructor
    arguments, attributes set after construction, its FP8 rules and the rules te_ref lacks."""
    ctor, _, _, _, _, shared = _module_problems("meta")[problem]
    if not shared or set(ctor) - {"softmax_type"}:
        return "te_fast's own rule (its constructor, attributes or FP8), tested on te_fast alone"
    return None


def _module_call(problem, device):
    """(the call: construct the module and call it, the exception, the message)."""
    ctor, (q, k, v), kwargs, exc, message, _ = _module_problems(device)[problem]

    def call():
        plain = {n: a for n, a in ctor.items() if not n.startswith("_")}
        attn = te_fast.UnfusedDotProductAttention(0.35, **plain).to(device)
        for name, value in ctor.items():  # an attribute set after construction
            if name.startswith("_"):
                setattr(attn, name[1:], value)
        return attn(q, k, v, **kwargs)

    return call, exc, message


def _adapter_call(adapter, problem, device):
    """The problem's call through the adapter's build and call: the module's configuration from
    an AttnCase, the bad part in the forward arguments."""
    ctor, (q, k, v), kwargs, _, _, _ = _module_problems(device)[problem]
    softmax_type = ctor.get("softmax_type", "vanilla")
    case = AttnCase("bshd_bshd_bshd", "fp32", "no_mask", device=device.type, b=2, sq=5, skv=5,
                    h=4, hg=2, d=8, dv=8, softmax_type=softmax_type)  # fmt: skip
    return lambda: adapter.call(adapter.build(case, 0.35), case, q, k, v, dict(kwargs))


@pytest.mark.per_adapter(problem=MODULE_PROBLEMS, device_name=DEVICES)
def test_module_rule(adapter, problem, device_name, monkeypatch):
    """The module raises the rule's exception, with a message naming the argument, the form it
    expects and what it got; te_ref raises the same message where it has the rule. Through each
    adapter that declares validates_arguments (te_fast's own rules on te_fast alone)."""
    record.case(impl=adapter.name, layout="bad_input", mask_type=f"module:{problem}",
                device=device_name)  # fmt: skip
    require(adapter, "validates_arguments")
    device = devices.require(device_name, needs_te_fast=adapter.name == "te_fast")
    reason = adapter.unavailable_reason(device_name)
    if reason:
        pytest.skip(reason)
    if problem in VALUE_PROBLEMS:
        monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    fn, exc, message = _module_call(problem, device)
    own = _te_fast_only(problem)
    if own is None:
        fn = _adapter_call(adapter, problem, device)
    elif adapter.name != "te_fast":
        pytest.skip(f"{adapter.name}: {own}")
    with pytest.raises(exc, match=message):
        fn()
    ctor, (q, k, v), kwargs, _, _, shared = _module_problems(device)[problem]
    if shared:
        ref_kwargs = {n.lstrip("_"): a for n, a in ctor.items()}
        with pytest.raises(ValueError, match=message):
            te_ref.dot_product_attention(q, k, v, **ref_kwargs, **kwargs)


# the problems of _module_problems whose argument has a batch axis of 3 where b = 2
BATCH_PROBLEMS = (
    "arbitrary_mask_batch", "arbitrary_mask_batch_1h", "padding_mask_batch",
    "padding_kv_mask_batch", "bias_batch", "slopes_batch",
)  # fmt: skip


@pytest.mark.per_adapter(problem=BATCH_PROBLEMS, device_name=DEVICES)
def test_batch_neither_one_nor_b(adapter, problem, device_name):
    """A mask, bias or alibi_slopes whose batch is neither 1 nor b (3 for b = 2) is refused by
    every adapter that validates its arguments, whatever the rest of the call: a broadcast over
    the batch would be silently wrong (SPEC §2.2-2.3 give the shapes [b|1, ...]; TE documents
    the masks as [batch_size, ...]). test_module_rule checks te_fast's and te_ref's messages."""
    record.case(impl=adapter.name, layout="bad_input", mask_type=f"batch:{problem}",
                device=device_name)  # fmt: skip
    device = devices.require(device_name, needs_te_fast=False)
    reason = adapter.unavailable_reason(device_name)
    if reason:
        pytest.skip(reason)
    require(adapter, "validates_arguments")
    _, (q, k, v), kwargs, _, _, _ = _module_problems(device)[problem]
    mask_type = kwargs["attn_mask_type"]
    case = AttnCase(
        "bshd_bshd_bshd", "fp32", mask_type, device=device_name, b=2, sq=q.shape[1],
        skv=k.shape[1], h=q.shape[2], hg=k.shape[2], d=q.shape[3], dv=v.shape[3],
        bias_type=kwargs.get("core_attention_bias_type", "no_bias"),
        alibi_slopes="bh" if "alibi_slopes" in kwargs else None,
        padding_from="mask" if mask_type == "padding" else "cu_seqlens",
    )  # fmt: skip
    reasons = adapter.not_supported_reasons(case)
    if reasons:
        pytest.skip("; ".join(reasons))
    with pytest.raises(adapter.argument_errors):
        adapter.call(adapter.build(case, 0.35), case, q, k, v, dict(kwargs))


def _raise_literals() -> list[tuple[str, str]]:
    """(file, the longest string literal) of each exception message te_fast's Python builds:
    every `raise X(...)` and every call of _err(...) in _call.py, attention.py and fp8.py."""
    found = []
    for name in ("_call.py", "attention.py", "fp8.py"):
        tree = ast.parse((ROOT / "te_fast" / name).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func.id if isinstance(node.func, ast.Name) else None
            if func not in ("_err", "ValueError", "NotImplementedError", "TypeError"):
                continue
            parts = [c.value for c in ast.walk(node.args[0])
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)]  # fmt: skip
            if parts:
                found.append((name, max(parts, key=len).strip()))
    return found


def test_every_module_rule_is_exercised():
    """Each exception message of te_fast/_call.py, attention.py and fp8.py (found by parsing)
    comes out of at least one problem of the table, on the CPU."""
    device = devices.require("cpu")
    messages = []
    for problem in MODULE_PROBLEMS:
        fn, _, _ = _module_call(problem, device)
        try:
            fn()
        except (ValueError, RuntimeError) as e:
            messages.append(str(e))
    for bad in (dict(amax_compute_algo="mean"), dict(amax_history_len=0)):
        with pytest.raises(ValueError) as info:
            DelayedScaling(**bad)
        messages.append(str(info.value))
    # Float8Tensor's own constructor check, with te_fast's message
    with pytest.raises(ValueError) as info:
        te_fast.fp8.Float8Tensor(torch.zeros(2), torch.ones(()), torch.float32)
    messages.append(str(info.value))
    literals = _raise_literals()
    assert len(literals) >= 40, f"the parser found only {len(literals)} messages"
    missing = [(f, lit) for f, lit in literals if not any(lit in m for m in messages)]
    assert not missing, f"rules no problem of the table raises: {missing}"
