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


# The variables that hold torch's CPU kernels to an instruction set (ATen's dispatch, oneDNN, MKL):
# part of the fingerprint when set, since they change the CPU kernels' rounding as the CPU does.
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo on Linux, else platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("model name", "Model", "Hardware"):
                return value.strip() or None
    except OSError:
        pass
    return platform.processor() or None


def cpu_capability() -> str | None:
    """The instruction set torch's CPU kernels dispatch to ("AVX512", "AVX2", "DEFAULT", ...:
    torch.backends.cpu.get_cpu_capability(), which follows ATEN_CPU_CAPABILITY). Asked of the
    loaded torch, else of a child process (the controller need not import torch for it)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    if "torch" in sys.modules:
        try:
            return str(sys.modules["torch"].backends.cpu.get_cpu_capability())
        except Exception:  # an older torch without the query
            return None
    out = _run([sys.executable, "-c", code])
    return out.strip() or None if out else None


def fingerprint(gpu_list: list[dict[str, str]] | None = None) -> dict:
    """What makes two runs of one implementation round alike: the CPU model and the instruction
    set torch's CPU kernels use (with the variables that hold them to one), the GPUs and their
    driver, torch's and CUDA's versions. Ratio growth gates only between runs of one
    fingerprint; between others it is drift (reports.compare)."""
    gpu_list = gpus() if gpu_list is None else gpu_list
    return {
        "cpu": cpu_model(),
        "cpu_capability": cpu_capability(),
        "isa_variables": {k: os.environ[k] for k in ISA_VARIABLES if os.environ.get(k)},
        "gpus": [f"{g.get('name')} (driver {g.get('driver')})" for g in gpu_list],
        **torch_versions(),
    }


def same_fingerprint(a: dict | None, b: dict | None) -> bool:
    """Whether two fingerprints are known and equal (a report without one matches nothing)."""
    return bool(a) and bool(b) and a == b


def fingerprint_difference(a: dict | None, b: dict | None) -> str:
    """What differs from fingerprint ``b`` (the baseline's) to ``a`` (this run's), for people:
    "cpu_capability 'AVX512' -> 'AVX2'"."""
    if not a or not b:
        lacking = [who for who, f in (("this run", a), ("the baseline", b)) if not f]
        return f"no fingerprint recorded in {' or '.join(lacking)}"
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "; ".join(f"{k} {b.get(k)!r} -> {a.get(k)!r}" for k in keys) or "same"


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
        "fingerprint": fingerprint(gpu_list),
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
