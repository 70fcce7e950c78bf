"""suites/te_fast/test_op_contracts.py::test_kernels_load_where_the_device_is fails on a machine
that has the device but not te_fast's kernels for it (issue 46: a CUDA machine whose build left
the CUDA kernels out skipped every GPU case and passed), and skips where the device is absent.
Played here on the CPU by standing in for both answers."""

from __future__ import annotations

import pytest

import te_fast
from te_conformance.suites import devices
from te_conformance.suites.te_fast import test_op_contracts as contracts

MISSING = "te_fast._C was built without CUDA kernels (stand-in)"


def test_a_gpu_machine_without_the_cuda_kernels_fails(monkeypatch):
    monkeypatch.setattr(devices, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(te_fast, "device_unavailable_reason", lambda d: MISSING)
    with pytest.raises(AssertionError, match="te_fast's cuda kernels did not load here"):
        contracts.test_kernels_load_where_the_device_is("cuda")


def test_a_machine_without_a_gpu_skips_the_cuda_case(monkeypatch):
    monkeypatch.setattr(devices, "cuda_unavailable_reason", lambda: "no CUDA device (stand-in)")
    monkeypatch.setattr(te_fast, "device_unavailable_reason", lambda d: MISSING)
    with pytest.raises(pytest.skip.Exception, match="no CUDA device"):
        contracts.test_kernels_load_where_the_device_is("cuda")


def test_the_cpu_kernels_load_here():
    if te_fast.UNAVAILABLE_REASON is not None:
        pytest.skip(f"te_fast unavailable: {te_fast.UNAVAILABLE_REASON}")
    contracts.test_kernels_load_where_the_device_is("cpu")
