"""Bitwise determinism and batch invariance (SPEC §3 ops, the module), on CPU and CUDA.

Determinism: every op's forward and backward, and the module's forward and backward without
dropout, give the same bytes over 10 runs; with dropout, the same seed gives the same bytes.
Batch invariance (what inference engines need for reproducible sampling): a softmax row's
output and its backward row are the same bytes alone, in a batch of one, or anywhere inside a
small or a large batch, on every kernel path (suites/checks/invariance.py has the checks).

The ops are te_fast's. The module tests run through every selected adapter: an adapter without
the `deterministic` capability (on the device: `capability_devices`), or without `dropout` for
the seeded-dropout test, skips with its reason, and so does a case it does not support.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reports import record
from suites import devices
from suites.adapters import ready
from suites.cases import AttnCase, sized
from suites.checks import coverage, invariance
from suites.op_cases import SOFTMAX_DTYPES, SOFTMAX_OPS

DEVICES = devices.device_params()




VARIANTS = [
    pytest.param(op, kind, id=f"{op}-{kind}_mask" if kind else op)
    for op, spec in SOFTMAX_OPS.items()
    for kind in (("batch", "bcast") if spec.masked else (None,))
]


def _record(what, dtype_name, device_name, mask_type="-"):
    record.case(impl="te_fast", layout=f"{what}", dtype=dtype_name, mask_type=mask_type,
                device=device_name)  # fmt: skip


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("op", list(SOFTMAX_OPS))
def test_op_determinism(op, dtype_name, device_name):
    """10 forward and 10 backward calls on every kernel path's row length: identical bytes."""
    _record(f"determinism:{op}", dtype_name, device_name)
    devices.require(device_name)
    for sk in invariance.PATH_LENGTHS[device_name]:
        invariance.check_determinism(op, dtype_name, device_name, sk)


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("dtype_name", SOFTMAX_DTYPES)
@pytest.mark.parametrize("op,mask_kind", VARIANTS)
def test_batch_invariance(op, mask_kind, dtype_name, device_name):
    """A row alone, in a batch of one, inside a small or large batch at any position: the same
    bytes, forward and backward, on every kernel path's row length."""
    _record(f"batch_invariance:{op}", dtype_name, device_name, mask_kind or "-")
    devices.require(device_name)
    for sk in invariance.PATH_LENGTHS[device_name]:
        invariance.check_batch_invariance(
            op, dtype_name, device_name, sk, mask_kind=mask_kind or "batch"
        )


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


@pytest.mark.per_adapter(device_name=DEVICES)
def test_module_dropout_same_seed(adapter, device_name):
    """With dropout 0.2 the same seed gives identical bytes (output and gradients) over 10 runs,
    and another seed a different output."""
    case = _module_case(AttnCase("bshd_bshd_bshd", "bf16", "causal"), device_name)
    record.case(impl=adapter.name, dropout=0.2, **case.fields())
    device = ready(adapter, case, "deterministic", "dropout")
    invariance.check_dropout_seeded(case, device, adapter=adapter)
