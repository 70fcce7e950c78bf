"""Runtime (never collection-time) checks of what a device can run, with skip reasons."""

from __future__ import annotations

import pytest
import torch

import te_fast

DEVICES = ("cpu", "cuda")


def cuda_unavailable_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device on this machine (GPU case)"
    return None


def require(device: str, needs_te_fast: bool = True) -> torch.device:
    """Skip the running test with a reason unless ``device`` can run it; returns the device."""
    if device == "cuda":
        reason = cuda_unavailable_reason()
        if reason:
            pytest.skip(reason)
    if needs_te_fast:
        reason = te_fast.device_unavailable_reason(device)
        if reason:
            pytest.skip(reason)
    return torch.device(device)


def device_params():
    """pytest params for the devices; the cuda one carries the gpu marker."""
    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
