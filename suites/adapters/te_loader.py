"""Importing Transformer Engine for the suites: its native build where it imports, else, on a
machine without CUDA, its own Python through the CPU stand-in (te_cpu_standin.py); once per
process, with the environment that keeps TE to its unfused backend set first. Used by the
transformer_engine adapter and by the TE deviations' reproducers (suites/te_deviations.py),
which import nothing of each other's."""

from __future__ import annotations

import os
import sys
from types import ModuleType

import torch

from te_conformance.suites.adapters import te_cpu_standin as te_cpu

# Set before transformer_engine is imported (TE reads some of them at import time): only the
# unfused backend may run, and it may emulate FP8 (TE >= 2.8 runs FP8 attention unfused only so).
TE_ENV = {
    "NVTE_FLASH_ATTN": "0",
    "NVTE_FUSED_ATTN": "0",
    "NVTE_UNFUSED_ATTN": "1",
    "NVTE_UnfusedDPA_Emulate_FP8": "1",
}

_loaded: tuple[ModuleType | None, str | None] | None = None  # (transformer_engine.pytorch, why not)


def load() -> tuple[ModuleType | None, str | None]:
    """(transformer_engine.pytorch, None), or (None, why it cannot be used); imported once, with
    TE_ENV set first. Called at run time only, never at collection.

    The real TE first (its native extension, on a GPU runner); where that import fails and torch
    sees no CUDA device, TE's Python again through the CPU stand-ins (te_cpu.import_te)."""
    global _loaded
    if _loaded is None:
        _loaded = _import()
    return _loaded


def stand_in() -> bool:
    """Whether TE runs through the CPU stand-in (not its native extension)."""
    return te_cpu.is_stand_in(sys.modules.get("transformer_engine_torch"))


def _import() -> tuple[ModuleType | None, str | None]:
    imported_before = "transformer_engine.pytorch" in sys.modules
    overridden = sorted(k for k, v in TE_ENV.items() if os.environ.get(k) != v)
    os.environ.update(TE_ENV)
    try:
        import transformer_engine.pytorch as te
    except Exception as e:  # not installed, or installed without its native parts
        native_error = f"{type(e).__name__}: {e}"
        absent = isinstance(e, ModuleNotFoundError) and e.name == "transformer_engine"
        if absent or torch.cuda.is_available():
            return None, f"transformer_engine not installed: {native_error}"
        try:
            te = te_cpu.import_te()
        except Exception as e2:
            te_cpu.forget_te()
            return None, (
                f"transformer_engine not installed: {native_error}; through the CPU stand-in: "
                f"{type(e2).__name__}: {e2}"
            )
        return te, None
    if imported_before and overridden:
        return None, (
            "transformer_engine was imported before this adapter could force its unfused backend "
            f"({', '.join(overridden)} differed from {TE_ENV}); set them in the environment "
            "before starting pytest"
        )
    return te, None


def te_version() -> str:
    te = sys.modules.get("transformer_engine")
    return str(getattr(te, "__version__", "?"))


def reset_alibi_cache(module) -> None:
    """Make TE rebuild its ALiBi slopes and bias on the next call, as in a fresh process: TE's
    module-global _alibi_cache (dpa.py:99-108) is invalidated only when heads, max lengths,
    alignment or slopes change (dpa.py:2689-2701), not when the actual lengths do (TE deviation
    D4); one suite case must not inherit the bias of the one before."""
    cache = getattr(sys.modules.get(type(module).__module__), "_alibi_cache", None)
    if isinstance(cache, dict):
        cache["_alibi_slopes_require_update"] = True
        cache["_alibi_bias_require_update"] = True
