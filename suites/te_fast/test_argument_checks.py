"""te_fast's argument checks, nothing lost: every check of its ops and every rule of its module
raises a ValueError/RuntimeError whose message names the argument, the form it expects and what
it got (dtype and shape for a tensor); on CUDA, bad cu_seqlens values raise the CPU's message
under TE_FAST_DEBUG_CHECKS=1 and are NaN-poisoned without a host sync otherwise. Two meta-tests
hold the tables complete: every check in csrc/checks.h and every raise in te_fast's Python must be
hit by a case here (or in suites/op_cases.py's and suites/bad_calls.py's tables). The standard's
module rules, through every adapter, are suites/conformance/test_bad_input.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

import te_fast
import te_ref
from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.bad_calls import (
    MODULE_PROBLEMS,
    TE_FAST_PROBLEMS,
    VALUE_PROBLEMS,
    module_problems,
)
from te_conformance.suites.checks import contracts
from te_conformance.suites.fuzz.checks import poisoned_rows
from te_conformance.suites.op_cases import BAD_CU_SEQLENS, bad_op_calls, bad_op_values
from te_fast import ops as fast
from te_fast.fp8 import DelayedScaling

ROOT = Path(__file__).resolve().parents[2]
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


def _module_call(problem, device):
    """(the call: construct the module and call it, the exception, the message)."""
    ctor, (q, k, v), kwargs, exc, message, _ = module_problems(device)[problem]

    def call():
        plain = {n: a for n, a in ctor.items() if not n.startswith("_")}
        attn = te_fast.UnfusedDotProductAttention(0.35, **plain).to(device)
        for name, value in ctor.items():  # an attribute set after construction
            if name.startswith("_"):
                setattr(attn, name[1:], value)
        return attn(q, k, v, **kwargs)

    return call, exc, message



@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("problem", TE_FAST_PROBLEMS)
def test_te_fast_module_rule(problem, device_name, monkeypatch):
    """te_fast's own module rules (its constructor, attributes set after construction, its FP8
    rules, rules te_ref lacks): the rule's exception, with a message naming the argument, the
    form it expects and what it got; te_ref raises the same message where it has the rule."""
    _record(f"module:{problem}", device_name)
    device = devices.require(device_name)
    if problem in VALUE_PROBLEMS:
        monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    fn, exc, message = _module_call(problem, device)
    with pytest.raises(exc, match=message):
        fn()
    ctor, (q, k, v), kwargs, _, _, shared = module_problems(device)[problem]
    if shared:
        ref_kwargs = {n.lstrip("_"): a for n, a in ctor.items()}
        with pytest.raises(ValueError, match=message):
            te_ref.dot_product_attention(q, k, v, **ref_kwargs, **kwargs)


def _raise_literals() -> list[tuple[str, str]]:
    """(file, the longest string literal) of each exception message te_fast's Python builds:
    every `raise X(...)` and every call of _err(...) in _arguments.py, attention.py and fp8.py."""
    found = []
    for name in ("_arguments.py", "attention.py", "fp8.py"):
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
    """Each exception message of te_fast/_arguments.py, attention.py and fp8.py (found by parsing)
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
