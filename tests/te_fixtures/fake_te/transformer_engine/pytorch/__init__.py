"""transformer_engine.pytorch as the adapter sees it: DotProductAttention, autocast and
fp8_autocast; records the environment it was imported under."""

import contextlib
import os

from transformer_engine.pytorch.attention import CALLS, FP8, DotProductAttention  # noqa: F401

NVTE = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN", "NVTE_UnfusedDPA_Emulate_FP8")
ENV_AT_IMPORT = {k: os.environ.get(k) for k in NVTE}


@contextlib.contextmanager
def _region(enabled, recipe):
    FP8["recipe"] = recipe if enabled else None
    try:
        yield
    finally:
        FP8["recipe"] = None


def autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None, _graph=False):
    """TE >= 2.12."""
    return _region(enabled, recipe)


def fp8_autocast(enabled=True, calibrating=False, fp8_recipe=None, fp8_group=None, _graph=False):
    """Every TE 2.x (deprecated from 2.12 on)."""
    return _region(enabled, fp8_recipe)
