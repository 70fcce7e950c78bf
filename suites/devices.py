"""Runtime (never collection-time) checks of what a device can run, with skip reasons."""

from __future__ import annotations

import os

import pytest
import torch

import te_fast
from te_conformance.suites import skips

DEVICES = ("cpu", "cuda")


def cuda_unavailable_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device on this machine (GPU case)"
    return None


def require(device: str, needs_te_fast: bool = True) -> torch.device:
    """The device, where this machine can run the test there (with te_fast's kernels, unless
    ``needs_te_fast`` is False); else a skip of kind "environment" with the reason."""
    if device == "cuda":
        skips.unless("environment", [cuda_unavailable_reason()])
    if needs_te_fast:
        skips.unless("environment", [te_fast.device_unavailable_reason(device)])
    return torch.device(device)


def device_params():
    """pytest params for the devices; the cuda one carries the gpu marker."""
    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


# Where ref64 (te_ref in float64) is computed: "auto" (default), on CUDA when this machine has a
# CUDA device, else on the case's device; "case", always on the case's device.
REFERENCE_DEVICE_ENV = "TE_CONFORMANCE_REFERENCE_DEVICE"


def reference_device(device) -> torch.device:
    """The device on which a case running on ``device`` computes its float64 reference (ref64):
    CUDA where this machine has a CUDA device (an H100 does 67 TFLOP/s in float64, a CPU core
    shared by a dozen xdist workers a few GFLOP/s), else ``device`` itself; ``device`` itself
    for a CUDA case, and with REFERENCE_DEVICE_ENV=case. Only ref64 moves: the implementation
    under test and the same-precision composite (ref_lp, whose rounding sets SPEC §6's bound)
    run on the case's device, and ref64 comes back to it (to_device) before it is judged."""
    device = torch.device(device)
    where = os.environ.get(REFERENCE_DEVICE_ENV, "auto")
    if where not in ("auto", "case"):
        raise ValueError(f"{REFERENCE_DEVICE_ENV} must be 'auto' or 'case', got {where!r}")
    if device.type == "cuda" or where == "case" or not torch.cuda.is_available():
        return device
    return torch.device("cuda")


def to_device(obj, device):
    """``obj`` with every tensor in it (nested in tuples, lists and dict values) on ``device``;
    tensors already there are returned as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj
