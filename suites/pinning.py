"""One GPU per pytest-xdist worker: worker N sees GPU N mod count via CUDA_VISIBLE_DEVICES; and
a share of the CPU cores per worker: torch's intra-op threads capped at cores // workers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

GPUS_ENV = "TE_CONFORMANCE_GPUS"  # the controller's GPU list, inherited by the workers
# torch's intra-op threads in each xdist worker: unset, cores // workers (at least 1); a number
# N > 0, N threads; 0, torch's own default (every core, in every worker)
THREADS_ENV = "TE_CONFORMANCE_THREADS"


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


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_worker(cores: int, workers: int, override: str | None = None) -> int | None:
    """torch's intra-op thread count for each of ``workers`` xdist workers on ``cores`` cores:
    max(1, cores // workers), or ``override`` (THREADS_ENV: N > 0 threads; 0, None: keep
    torch's default). Without the cap every worker runs torch's default of one thread per core,
    so 14 workers on 16 cores run 224 threads whose spin-waits on each parallel op make the whole
    run several times slower than its arithmetic."""
    if override is not None and override.strip() != "":
        n = int(override)
        if n < 0:
            raise ValueError(f"{THREADS_ENV} must be >= 0, got {override!r}")
        return n or None
    return max(1, cores // max(1, workers))


def worker_threads(workers: int | None = None) -> int | None:
    """The thread count of each of ``workers`` xdist workers (default: this worker's
    PYTEST_XDIST_WORKER_COUNT), from the cores and THREADS_ENV: threads_per_worker; None
    without workers or THREADS_ENV (outside xdist): torch's default."""
    override = os.environ.get(THREADS_ENV)
    if workers is None:
        count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
        workers = int(count) if count else None
    if not workers and not override:
        return None
    return threads_per_worker(available_cores(), workers or 1, override)


def header(config) -> str:
    """The pytest header's line: torch's threads in each worker, and where ref64 is computed."""
    from te_conformance.suites import devices

    workers = len(getattr(config.option, "tx", None) or [])  # xdist's, once -n is resolved
    threads = worker_threads(workers)
    where = f"{threads} per worker" if threads else "torch's default"
    return (
        f"te-threads: {where} ({available_cores()} cores, {workers or 'no'} xdist workers; "
        f"{THREADS_ENV}={os.environ.get(THREADS_ENV, '')}); ref64 of CPU cases on "
        f"{devices.reference_device('cpu').type} "
        f"({devices.REFERENCE_DEVICE_ENV}={os.environ.get(devices.REFERENCE_DEVICE_ENV, 'auto')})"
    )


def configure(config) -> None:
    """Controller: publish the GPU list to the workers. Worker: pin itself to one GPU and cap
    torch's intra-op threads (worker_threads).

    Runs in pytest_configure, before any test module is imported, so before CUDA is initialised
    in the worker; CUDA reads CUDA_VISIBLE_DEVICES only when it initialises.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    threads = worker_threads()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if worker is None:
        if getattr(config.option, "numprocesses", None) and GPUS_ENV not in os.environ:
            gpus = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), _nvidia_smi_indices())
            os.environ[GPUS_ENV] = ",".join(gpus)
        return
    gpus = [g for g in os.environ.get(GPUS_ENV, "").split(",") if g]
    gpu = gpu_for_worker(worker, gpus)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
