"""The adapter registry: which implementations the suites can drive, and how tests pick them.

An adapter (suites/adapters/base.py) declares what one implementation supports, as data, and
which CAPABILITIES it has; the suites generate their parametrization from these declarations
and skip the rest with the reasons `not_supported_reasons` and `lacks` give. `--impl NAME`
selects adapters. The adapters themselves: te_fast.py, torch_sdpa.py, transformer_engine.py.
"""

from __future__ import annotations

import pytest

from suites.adapters.base import CAPABILITIES, Adapter  # noqa: F401  (re-exported)
from suites.adapters.te_fast import TeFast
from suites.adapters.torch_sdpa import TorchSdpa
from suites.adapters.transformer_engine import TransformerEngine

ADAPTERS: dict[str, Adapter] = {a.name: a for a in (TeFast(), TorchSdpa(), TransformerEngine())}


def selected(config, pool: dict[str, Adapter] | None = None) -> list[Adapter]:
    """The adapters chosen with --impl (default: every adapter marked default)."""
    pool = ADAPTERS if pool is None else pool
    names = config.getoption("--impl") if config is not None else None
    if not names:
        return [a for a in pool.values() if a.default]
    unknown = [n for n in names if n not in pool]
    if unknown:
        raise pytest.UsageError(f"--impl {unknown}: unknown; known adapters: {sorted(pool)}")
    return [pool[n] for n in names]


def require(adapter: Adapter, capability: str) -> None:
    """Skip the running test, with the adapter's reason, unless it has ``capability``."""
    reason = adapter.lacks(capability)
    if reason:
        pytest.skip(reason)


# The tests that need a capability ran on te_fast alone before adapters declared capabilities;
# te_fast keeps their ids (no adapter name) so that reports still compare with older baselines.
UNNAMED_IN_IDS = "te_fast"


def parametrize_per_adapter(metafunc, axes: dict) -> None:
    """Parametrize over ``axes`` (argname -> values, in id order, as stacked parametrize
    decorators would) and over the selected adapters (argument ``adapter``), which join the last
    axis: its id is bare for te_fast and gains ``-<adapter name>`` for any other adapter."""
    *leading, (last, values) = axes.items()
    for argname, argvalues in leading:
        metafunc.parametrize(argname, argvalues)
    params = []
    for adapter in selected(metafunc.config):
        suffix = "" if adapter.name == UNNAMED_IN_IDS else f"-{adapter.name}"
        for value in values:
            if not hasattr(value, "marks"):  # a plain value, not a pytest.param
                value = pytest.param(value, id=str(value))
            base = value.id if value.id is not None else str(value.values[0])
            params.append(pytest.param(adapter, *value.values, id=base + suffix, marks=value.marks))
    metafunc.parametrize(f"adapter,{last}", params)
