"""Bad input through every adapter: each argument rule of the standard (SPEC §1-2, TE's checks)
is refused by every adapter that declares `validates_arguments` (the others skip with their
reason), with a message naming the argument, the form it expects and what it got; te_ref raises
the same message. The problems are suites/bad_calls.py's STANDARD_PROBLEMS; te_fast's own rules
(constructor, attributes, FP8) and its op checks are suites/te_fast/test_argument_checks.py."""

from __future__ import annotations

import pytest

import te_ref
from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.adapters import ready
from te_conformance.suites.bad_calls import (
    BATCH_PROBLEMS,
    STANDARD_PROBLEMS,
    VALUE_PROBLEMS,
    adapter_call,
    module_problems,
)
from te_conformance.suites.cases import AttnCase

DEVICES = devices.device_params()
pytestmark = pytest.mark.feature("argument_checks")


@pytest.mark.per_adapter(problem=STANDARD_PROBLEMS, device_name=DEVICES)
def test_module_rule(adapter, problem, device_name, monkeypatch):
    """The module raises the rule's exception, with a message naming the argument, the form it
    expects and what it got; te_ref raises the same message."""
    record.case(impl=adapter.name, problem=problem, device=device_name)
    device = ready(adapter, None, "validates_arguments", device=device_name)
    if problem in VALUE_PROBLEMS:  # te_fast checks cu_seqlens values on CUDA only when asked
        monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    ctor, (q, k, v), kwargs, exc, message, _ = module_problems(device)[problem]
    with pytest.raises(exc, match=message):
        adapter_call(adapter, problem, device)()
    with pytest.raises(ValueError, match=message):  # ctor: softmax_type at most
        te_ref.dot_product_attention(q, k, v, **ctor, **kwargs)


@pytest.mark.per_adapter(problem=BATCH_PROBLEMS, device_name=DEVICES)
def test_batch_neither_one_nor_b(adapter, problem, device_name):
    """A mask, bias or alibi_slopes whose batch is neither 1 nor b (3 for b = 2) is refused by
    every adapter that validates its arguments, whatever the rest of the call: a broadcast over
    the batch would be silently wrong (SPEC §2.2-2.3 give the shapes [b|1, ...]; TE documents
    the masks as [batch_size, ...]). test_module_rule checks te_fast's and te_ref's messages."""
    record.case(impl=adapter.name, problem=problem, device=device_name)
    _, (q, k, v), kwargs, _, _, _ = module_problems("meta")[problem]
    mask_type = kwargs["attn_mask_type"]
    case = AttnCase(
        "bshd_bshd_bshd", "fp32", mask_type, device=device_name, b=2, sq=q.shape[1],
        skv=k.shape[1], h=q.shape[2], hg=k.shape[2], d=q.shape[3], dv=v.shape[3],
        bias_type=kwargs.get("core_attention_bias_type", "no_bias"),
        alibi_slopes="bh" if "alibi_slopes" in kwargs else None,
        padding_from="mask" if mask_type == "padding" else "cu_seqlens",
    )  # fmt: skip
    device = ready(adapter, case, "validates_arguments")
    _, (q, k, v), kwargs, _, _, _ = module_problems(device)[problem]
    with pytest.raises(adapter.argument_errors):
        adapter.call(adapter.build(case, 0.35), case, q, k, v, dict(kwargs))
