"""Loads te_fast._C and records why it could not be loaded instead of raising."""

from __future__ import annotations

import torch

from te_fast._registry import OP_NAMES  # the ops that _C must define

_BUILD_HINT = "build it with `pip install --no-build-isolation -e .` from the repository root"


def _load() -> str | None:
    try:
        from te_fast import _C  # noqa: F401  (loading registers the te_fast ops)
    except Exception as exc:  # ImportError, undefined symbols from a torch mismatch, ...
        return f"te_fast._C could not be loaded ({type(exc).__name__}: {exc}); {_BUILD_HINT}"
    missing = [n for n in OP_NAMES if not hasattr(torch.ops.te_fast, n)]
    if missing:
        return f"te_fast._C is loaded but lacks ops {missing}; rebuild it ({_BUILD_HINT})"
    return None


UNAVAILABLE_REASON: str | None = _load()


def has_kernel(device_type: str) -> bool:
    """True when every te_fast op has a kernel for ``device_type`` ("cpu" or "cuda")."""
    if UNAVAILABLE_REASON is not None:
        return False
    key = {"cpu": "CPU", "cuda": "CUDA"}[device_type]
    return all(
        torch._C._dispatch_has_kernel_for_dispatch_key(f"te_fast::{n}", key) for n in OP_NAMES
    )


def device_unavailable_reason(device_type: str) -> str | None:
    """Why te_fast cannot run on ``device_type`` (None when it can)."""
    if UNAVAILABLE_REASON is not None:
        return UNAVAILABLE_REASON
    if not has_kernel(device_type):
        return (
            f"te_fast._C was built without {device_type.upper()} kernels "
            "(CUDA kernels need a CUDA build of torch and a CUDA toolkit at build time; "
            "TE_FAST_FORCE_CUDA=1 forces them)"
        )
    return None
