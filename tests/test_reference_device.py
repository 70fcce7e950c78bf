"""Unit tests of suites/devices.py reference_device and to_device: where ref64 is computed."""

import pytest
import torch

from te_conformance.suites import devices


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_cpu_only_machine_keeps_ref64_on_the_cpu(no_cuda, monkeypatch):
    monkeypatch.delenv(devices.REFERENCE_DEVICE_ENV, raising=False)
    assert devices.reference_device("cpu") == torch.device("cpu")
    assert devices.reference_device(torch.device("cpu")) == torch.device("cpu")


def test_cuda_machine_moves_cpu_cases_ref64_to_cuda(with_cuda, monkeypatch):
    monkeypatch.delenv(devices.REFERENCE_DEVICE_ENV, raising=False)
    assert devices.reference_device("cpu") == torch.device("cuda")
    assert devices.reference_device("cuda:0") == torch.device("cuda:0")  # CUDA cases stay


def test_env_keeps_ref64_on_the_case_device(with_cuda, monkeypatch):
    monkeypatch.setenv(devices.REFERENCE_DEVICE_ENV, "case")
    assert devices.reference_device("cpu") == torch.device("cpu")
    monkeypatch.setenv(devices.REFERENCE_DEVICE_ENV, "gpu")
    with pytest.raises(ValueError, match=devices.REFERENCE_DEVICE_ENV):
        devices.reference_device("cpu")


def test_this_machine_without_cuda_keeps_ref64_home(monkeypatch):
    monkeypatch.delenv(devices.REFERENCE_DEVICE_ENV, raising=False)
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert devices.reference_device("cpu").type == "cpu"


def test_to_device_moves_nested_tensors():
    t = torch.ones(2)
    moved = devices.to_device({"a": (t, [t, 3]), "b": None, "c": "x"}, "cpu")
    assert moved["a"][0] is t and moved["a"][1][0] is t and moved["a"][1][1] == 3
    assert isinstance(moved["a"], tuple) and isinstance(moved["a"][1], list)
    assert moved["b"] is None and moved["c"] == "x"
    assert devices.to_device((), "cpu") == ()
