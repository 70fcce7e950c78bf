"""Bitwise determinism of the attention module, through every selected adapter (SPEC §3), on CPU
and CUDA: without dropout, the same bytes over 10 forward and backward runs; with dropout, the
same seed gives the same bytes and another seed another output. An adapter without the
`deterministic` capability (on the device: its declared devices), or without `dropout` for the
seeded-dropout test, skips with its reason, and so does a case it does not support. te_fast's
ops (determinism and batch invariance): suites/te_fast/test_op_determinism.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.adapters import ready
from te_conformance.suites.cases import AttnCase, sized
from te_conformance.suites.checks import coverage, invariance

DEVICES = devices.device_params()
pytestmark = pytest.mark.feature("determinism")


# ----------------------------------------------------------------------------- the module

MODULE_CASES = [
    AttnCase("bshd_bshd_bshd", "bf16", "causal", hg=2),
    AttnCase("sbh3d", "bf16", "no_mask", bias_type="alibi"),
    AttnCase("thd_thd_thd", "bf16", "padding_causal", varlen="trailing"),
    AttnCase("thd_bshd_bshd", "bf16", "padding_causal_bottom_right", kv_cache_extra=5),
    AttnCase("bs3hd", "fp16", "no_mask", softmax_type="learnable", offset_via="param"),
    AttnCase("sbhd_sbhd_sbhd", "fp32", "arbitrary", window=(4, 2), return_max_logit=True),
    AttnCase("bshd_bs2hd", "bf16", "padding", padding_from="mask", bias_type="post_scale_bias",
             bias_shape="1hss", skv=51),
]  # fmt: skip
CPU_DTYPE = {"fp16": "bf16"}  # CPU cases of fp16 layouts run in bf16 (te_ref's CPU composite)


def _module_case(case: AttnCase, device_name: str) -> AttnCase:
    dtype = CPU_DTYPE.get(case.dtype, case.dtype) if device_name == "cpu" else case.dtype
    cross = case.skv != case.sq
    return sized(replace(case, device=device_name, dtype=dtype), cross=cross,
                 gqa=case.h // case.hg)  # fmt: skip


MODULE_PARAMS = [pytest.param(c, id=c.id.rsplit("-", 1)[0]) for c in MODULE_CASES]


@pytest.mark.per_adapter(case=MODULE_PARAMS, device_name=DEVICES)
def test_module_determinism(adapter, case, device_name):
    """The attention module without dropout: 10 forward+backward runs, identical bytes
    (output, max_logit, every gradient)."""
    case = _module_case(case, device_name)
    record.case(impl=adapter.name, **case.fields())
    # max_logit left out where the adapter returns none (suites/checks/coverage.py)
    case, notes = coverage.runnable(adapter, case) or (case, {})
    device = ready(adapter, case, "deterministic")
    if notes:
        record.case(**notes)
    invariance.check_module_determinism(case, device, adapter=adapter)


@pytest.mark.feature("dropout")
@pytest.mark.per_adapter(device_name=DEVICES)
def test_module_dropout_same_seed(adapter, device_name):
    """With dropout 0.2 the same seed gives identical bytes (output and gradients) over 10 runs,
    and another seed a different output."""
    case = _module_case(AttnCase("bshd_bshd_bshd", "bf16", "causal"), device_name)
    record.case(impl=adapter.name, dropout=0.2, **case.fields())
    device = ready(adapter, case, "deterministic", "dropout")
    invariance.check_dropout_seeded(case, device, adapter=adapter)
