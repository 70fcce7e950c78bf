"""Unit tests of the xdist worker -> GPU pinning (suites/pinning.py), with simulated GPU lists."""

import pytest

from te_conformance.suites import pinning


@pytest.mark.parametrize(
    "visible,smi,expected",
    [
        (None, ["0", "1", "2", "3"], ["0", "1", "2", "3"]),
        ("2,3", ["0", "1", "2", "3"], ["2", "3"]),
        ("GPU-aaaa, GPU-bbbb", ["0", "1"], ["GPU-aaaa", "GPU-bbbb"]),
        ("", ["0"], []),
        ("-1", ["0"], []),
        (None, [], []),
    ],
)
def test_visible_gpus(visible, smi, expected):
    assert pinning.visible_gpus(visible, smi) == expected


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_workers_spread_round_robin(count):
    gpus = [str(i) for i in range(count)]
    workers = [f"gw{n}" for n in range(16)]
    assigned = [pinning.gpu_for_worker(w, gpus) for w in workers]
    assert assigned == [gpus[n % count] for n in range(16)]
    per_gpu = {g: assigned.count(g) for g in gpus}
    assert max(per_gpu.values()) - min(per_gpu.values()) <= 1  # balanced


@pytest.mark.parametrize("worker", [None, "", "master", "gwx", "gw"])
def test_no_pinning_outside_xdist_workers(worker):
    assert pinning.gpu_for_worker(worker, ["0", "1"]) is None


def test_no_gpus_no_pinning():
    assert pinning.gpu_for_worker("gw3", []) is None


def test_configure_pins_worker_from_controller_list(monkeypatch):
    class Config:
        class option:
            numprocesses = 4

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")
    monkeypatch.setenv(pinning.GPUS_ENV, "0,1,2,3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    pinning.configure(Config)
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def test_configure_controller_publishes_list(monkeypatch):
    class Config:
        class option:
            numprocesses = 2

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv(pinning.GPUS_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    pinning.configure(Config)
    import os

    assert os.environ[pinning.GPUS_ENV] == "3,5"


# ----------------------------------------------------------------------------- threads per worker


@pytest.mark.parametrize(
    "cores,workers,expected",
    [(16, 14, 1), (16, 8, 2), (16, 4, 4), (16, 1, 16), (2, 2, 1), (2, 1, 2), (4, 16, 1), (3, 0, 3)],
)
def test_threads_per_worker_share_the_cores(cores, workers, expected):
    assert pinning.threads_per_worker(cores, workers) == expected


@pytest.mark.parametrize("override,expected", [("3", 3), ("1", 1), ("0", None), ("", 1)])
def test_threads_override(override, expected):
    assert pinning.threads_per_worker(16, 14, override) == expected


def test_threads_override_rejects_negative():
    with pytest.raises(ValueError, match=pinning.THREADS_ENV):
        pinning.threads_per_worker(16, 14, "-1")


def test_worker_threads_from_the_worker_count(monkeypatch):
    monkeypatch.delenv(pinning.THREADS_ENV, raising=False)
    monkeypatch.setattr(pinning, "available_cores", lambda: 16)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "14")
    assert pinning.worker_threads() == 1
    assert pinning.worker_threads(4) == 4
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
    assert pinning.worker_threads() is None  # outside xdist: torch's default
    monkeypatch.setenv(pinning.THREADS_ENV, "2")
    assert pinning.worker_threads() == 2


def test_configure_caps_the_worker_threads(monkeypatch):
    import torch

    class Config:
        class option:
            numprocesses = 2

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setattr(pinning, "available_cores", lambda: 7)
    monkeypatch.delenv(pinning.THREADS_ENV, raising=False)
    monkeypatch.setenv(pinning.GPUS_ENV, "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    threads = torch.get_num_threads()
    try:
        pinning.configure(Config)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(threads)
