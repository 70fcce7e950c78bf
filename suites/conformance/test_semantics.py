"""The semantics table through every selected adapter: the literal keep/drop grids of every mask
type, alignment, window and shape (suites/checks/mask_table.py holds the table, how a mask is
observed and what is crossed), and the argument rules the standard refuses (a thd q with a
non-padding type, an attention_mask with a type that takes none). te_ref itself against the
same table: suites/judge/test_te_ref.py."""

from __future__ import annotations

import pytest
import torch

from te_conformance.reports import record
from te_conformance.suites import devices, expected, skips
from te_conformance.suites.cases import AttnCase
from te_conformance.suites.checks.failures import CheckError
from te_conformance.suites.checks.mask_table import ROWS, B, D, H, cu_seqlens, run_table
from te_ref.layouts import parse_layout

pytestmark = pytest.mark.usefixtures("one_thread")  # suites/plugin.py: tiny tensors, one thread


@pytest.mark.per_adapter(row=ROWS, device_name=devices.device_params())
def test_mask_table(adapter, row, device_name):
    """Each adapter against the literal table, over every code path variant (module docstring);
    combinations an adapter does not support are left out (skipped when none is left)."""
    variant_name, mask_type, dtype_name = row
    run_table(adapter, variant_name, mask_type, dtype_name, device_name)


# ----------------------------------------------------------------------------- argument rules


def _error_call(adapter, device_name, layout, mask_type, mask=None):
    """One call that the standard rejects, through ``adapter``: (the exception, or None).
    ``mask``: "padding" passes a [b, 1, 1, s] attention_mask, "arbitrary" a [1, 1, s, s] one."""
    case = AttnCase(layout, "fp32", mask_type, device=device_name, b=B, sq=4, skv=4, h=H, hg=H,
                    d=D, dv=D)  # fmt: skip
    # the call is refused for its mask type: the adapter's support of it is not asked
    skips.unless("declined", adapter.declines(case, ("validates_arguments",),
                                              ignore=("mask_types",)))  # fmt: skip
    device = devices.require(device_name, needs_te_fast=False)
    skips.unless("environment", [adapter.unavailable_reason(device_name)])
    lengths = [4, 3, 2]
    cu = cu_seqlens(lengths, device)
    if parse_layout(layout).q_format == "thd":
        q, k, v = (torch.randn(sum(lengths), H, D, device=device) for _ in range(3))
        kwargs = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=4, max_seqlen_kv=4)
    else:
        q, k, v = (torch.randn(B, 4, H, D, device=device) for _ in range(3))
        kwargs = {}
    kwargs.update(qkv_layout=layout, attn_mask_type=mask_type)
    if mask is not None:
        shape = (B, 1, 1, 4) if mask == "padding" else (1, 1, 4, 4)
        kwargs["attention_mask"] = torch.zeros(shape, dtype=torch.bool, device=device)
    try:
        adapter.call(adapter.build(case, 1.0), case, q, k, v, kwargs)
    except adapter.argument_errors as e:
        return e, kwargs
    return None, kwargs


def _expect_error(adapter, case_kwargs, what: str, error, call_kwargs) -> None:
    """The call must have raised; where the adapter's recorded deviations say it does not, that
    is expected (suites/expected.py: a "refusal" failure; a call that raised then fails as
    "no longer shows")."""
    deviations = adapter.known_deviations(AttnCase(**case_kwargs), call_kwargs=call_kwargs)
    expected.expect(*(expected.from_deviation(d, adapter.name) for d in deviations))
    if error is None:
        raise CheckError.new("refusal", "call", f"{what}: the call returned; the standard "
                             "rejects it")  # fmt: skip


@pytest.mark.feature("argument_checks")
@pytest.mark.per_adapter(
    mask_type=["no_mask", "causal", "causal_bottom_right", "arbitrary"],
    device_name=devices.device_params(),
)
def test_thd_takes_padding_types_only(adapter, mask_type, device_name):
    """A thd q with a non-padding mask type is an error (SPEC §1; TE 2.20.2
    dot_product_attention.py:2449-2452 asserts "Attention mask type must be padding or
    padding_causal for qkv_format=thd!")."""
    record.case(impl=adapter.name, layout="thd_thd_thd", mask_type=mask_type, device=device_name)
    mask = "arbitrary" if mask_type == "arbitrary" else None
    error, kwargs = _error_call(adapter, device_name, "thd_thd_thd", mask_type, mask)
    case = dict(layout="thd_thd_thd", dtype="fp32", mask_type=mask_type, device=device_name)
    _expect_error(adapter, case, f"thd with attn_mask_type={mask_type!r}", error, kwargs)


@pytest.mark.feature("argument_checks")
@pytest.mark.per_adapter(
    mask_type=["no_mask", "causal", "causal_bottom_right"], device_name=devices.device_params()
)
def test_attention_mask_only_with_padding_or_arbitrary(adapter, mask_type, device_name):
    """An attention_mask with a type that does not use one is an error: TE 2.20.2's docstring
    (DotProductAttention.forward, attention_mask: "only used ... for 'padding', 'padding_causal',
    'padding_causal_bottom_right' and 'arbitrary'; should be None for others") and SPEC §2.3."""
    record.case(impl=adapter.name, layout="bshd_bshd_bshd", mask_type=mask_type,
                device=device_name)  # fmt: skip
    error, kwargs = _error_call(adapter, device_name, "bshd_bshd_bshd", mask_type, "padding")
    case = dict(layout="bshd_bshd_bshd", dtype="fp32", mask_type=mask_type, device=device_name)
    what = f"attention_mask with attn_mask_type={mask_type!r}"
    _expect_error(adapter, case, what, error, kwargs)
