"""Property-based contract fuzzing (hypothesis) of every te_fast op on drawn inputs (the module of
every adapter: suites/conformance/test_fuzz.py). Per example: no output aliases an input, no
input byte changes, the fake matches the real output, the numerics equal te_ref's under SPEC §6,
each example's one draw judged on its own by the function the deterministic suites use
(suites/fuzz/checks.py has the checks, suites/fuzz/strategies.py what is drawn; profiles:
pytest --hypothesis-profile ci|gpu|explore). The draws are seeded from the test's case key and
do not depend on what else was imported.

A failure prints hypothesis' shrunk "Falsifying example" and a ready-to-paste reproducer line.
"""

from __future__ import annotations

import pytest

from te_conformance.suites import devices
from te_conformance.suites.fuzz import HYPOTHESIS_MISSING

pytest.importorskip("hypothesis", reason=HYPOTHESIS_MISSING)

from te_conformance.suites.fuzz import checks as fc  # noqa: E402
from te_conformance.suites.fuzz import strategies as fs  # noqa: E402
from te_conformance.suites.op_cases import SOFTMAX_OPS  # noqa: E402

DEVICES = devices.device_params()


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("op", list(SOFTMAX_OPS))
def test_fuzz_softmax(op, device_name, fuzz_key):
    """The forward op and its backward on drawn shapes, layouts, scales, masks and -inf."""
    n = fs.record_run(op, device_name, "softmax")
    devices.require(device_name)
    fs.fuzz(fc.check_softmax_example, fs.softmax_examples(op, device_name), device_name, n,
            explicit=fs.softmax_explicit(op), key=fuzz_key)  # fmt: skip


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("direction", ["thd_to_bshd", "bshd_to_thd"])
def test_fuzz_convert(direction, device_name, monkeypatch, fuzz_key):
    """THD<->BSHD on drawn ragged batches, dtypes and layouts; half the examples break one
    cu_seqlens/length rule: an error on CPU, NaN-poisoned rows on CUDA (no debug checks)."""
    n = fs.record_run(f"convert_{direction}", device_name, "convert")
    devices.require(device_name)
    monkeypatch.delenv("TE_FAST_DEBUG_CHECKS", raising=False)
    fs.fuzz(fc.check_convert_example, fs.convert_examples(direction), device_name, n,
            explicit=fs.convert_explicit(direction), key=fuzz_key)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["thd_to_bshd", "bshd_to_thd"])
def test_fuzz_convert_debug_checks(direction, monkeypatch, fuzz_key):
    """CUDA with TE_FAST_DEBUG_CHECKS=1: bad cu_seqlens raise, naming the op and the argument."""
    n = fs.record_run(f"convert_{direction}_debug", "cuda", "convert")
    devices.require("cuda")
    monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    fs.fuzz(fc.check_convert_example, fs.convert_examples(direction), "cuda", n,
            explicit=fs.convert_explicit(direction), key=fuzz_key)  # fmt: skip
