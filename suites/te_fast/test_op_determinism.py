"""Bitwise determinism and batch invariance of te_fast's ops (SPEC §3), on CPU and CUDA.

Determinism: every op's forward and backward give the same bytes over 10 runs. Batch invariance
(what inference engines need for reproducible sampling): a softmax row's output and its backward
row are the same bytes alone, in a batch of one, or anywhere inside a small or a large batch, on
every kernel path (suites/checks/invariance.py has the checks). The module's determinism,
through every adapter: suites/conformance/test_determinism.py.
"""

from __future__ import annotations

import pytest

from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.checks import invariance
from te_conformance.suites.op_cases import SOFTMAX_DTYPES, SOFTMAX_OPS

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
