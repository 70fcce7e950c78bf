"""One GPU per pytest-xdist worker: worker N sees GPU N mod count via CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

GPUS_ENV = "TE_CONFORMANCE_GPUS"  # the controller's GPU list, inherited by the workers


def visible_gpus(cuda_visible_devices: str | None, nvidia_smi_indices: list[str]) -> list[str]:
    """The GPUs the controller may hand out: CUDA_VISIBLE_DEVICES if set, else every GPU."""
    if cuda_visible_devices is not None:
        return [
            g.strip() for g in cuda_visible_devices.split(",") if g.strip() and g.strip() != "-1"
        ]
    return list(nvidia_smi_indices)


def gpu_for_worker(worker_id: str | None, gpus: list[str]) -> str | None:
    """The GPU of xdist worker ``gwN``: gpus[N % len(gpus)]; None outside xdist or without GPUs."""
    if not worker_id or not gpus:
        return None
    match = re.fullmatch(r"gw(\d+)", worker_id)
    if match is None:
        return None
    return gpus[int(match.group(1)) % len(gpus)]


def _nvidia_smi_indices() -> list[str]:
    """GPU indices from nvidia-smi: asks the driver without creating a CUDA context."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def configure(config) -> None:
    """Controller: publish the GPU list to the workers. Worker: pin itself to one GPU.

    Runs in pytest_configure, before any test module is imported, so before CUDA is initialised
    in the worker; CUDA reads CUDA_VISIBLE_DEVICES only when it initialises.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        if getattr(config.option, "numprocesses", None) and GPUS_ENV not in os.environ:
            gpus = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), _nvidia_smi_indices())
            os.environ[GPUS_ENV] = ",".join(gpus)
        return
    gpus = [g for g in os.environ.get(GPUS_ENV, "").split(",") if g]
    gpu = gpu_for_worker(worker, gpus)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
