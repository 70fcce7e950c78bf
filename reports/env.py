"""The environment header of a report: versions, GPUs, git commit, machine class."""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import runpy
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path


def _run(cmd: list[str], cwd: Path | str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def gpus() -> list[dict[str, str]]:
    """GPUs visible to nvidia-smi as [{"name", "driver"}]; [] without NVIDIA GPUs.

    nvidia-smi rather than torch.cuda: the pytest controller must never initialise CUDA.
    """
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    rows = [line.rsplit(",", 1) for line in (out or "").splitlines() if "," in line]
    return [{"name": name.strip(), "driver": driver.strip()} for name, driver in rows]


_NOISE = re.compile(r"^(nvidia|geforce|tesla|quadro|\d+gb|hbm\d*e?|sxm\d*|pcie|nvl)$")


def machine_class_from_gpu(name: str) -> str:
    """Slug of a GPU name: "NVIDIA H100 80GB HBM3" -> "h100", "GeForce RTX 4090" -> "rtx4090"."""
    tokens = [t for t in re.split(r"[\s\-_/()]+", name.lower()) if t and not _NOISE.match(t)]
    for i, token in enumerate(tokens):
        if re.search(r"\d", token):
            return tokens[i - 1] + token if token.isdigit() and i else token
    return "-".join(tokens) or "gpu"


def machine_class(gpu_list: list[dict[str, str]] | None = None) -> str:
    """Name of the baseline to compare against: "cpu" or the first GPU's slug."""
    gpu_list = gpus() if gpu_list is None else gpu_list
    return machine_class_from_gpu(gpu_list[0]["name"]) if gpu_list else "cpu"


def torch_versions() -> dict[str, str | None]:
    """torch.__version__ and torch.version.cuda, without importing torch when it is not loaded.

    Importing torch costs seconds in a controller that never needs it; torch/version.py is a
    file of constants, so reading it gives the same answer.
    """
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        return {"torch": str(torch.__version__), "torch_cuda": torch.version.cuda}
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"torch": None, "torch_cuda": None}
    try:
        consts = runpy.run_path(os.path.join(spec.submodule_search_locations[0], "version.py"))
    except Exception:  # an unusual torch build: fall back to the real import
        import torch

        return {"torch": str(torch.__version__), "torch_cuda": torch.version.cuda}
    return {"torch": consts.get("__version__"), "torch_cuda": consts.get("cuda")}


def git_commit(cwd: Path | str) -> str | None:
    """HEAD of the repository at cwd, with "-dirty" for uncommitted changes; None outside git."""
    head = _run(["git", "rev-parse", "HEAD"], cwd)
    if not head:
        return None
    status = _run(["git", "status", "--porcelain"], cwd)
    return head.strip() + ("-dirty" if status and status.strip() else "")


def environment(
    rootdir: Path | str, args: list[str], shard: str | None, machine: str | None = None
) -> dict:
    """The report's environment header (machine: override of the detected machine class)."""
    gpu_list = gpus()
    return {
        **torch_versions(),
        "gpus": gpu_list,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "git_commit": git_commit(rootdir),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pytest_args": list(args),
        "shard": shard,
        "machine_class": machine or machine_class(gpu_list),
    }
