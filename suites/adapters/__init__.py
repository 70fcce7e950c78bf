"""The adapter registry: which implementations the suites can drive, and how tests pick them.

An adapter (suites/adapters/base.py) declares what one implementation supports in one place,
``support`` (suites/adapters/support.py); the suites generate their parametrization over the
selected adapters and ``ready`` applies the declaration to a test: its device, or a skip with
the adapter's reasons, recorded with its kind. `--impl NAME` selects adapters: a name
registered here, the name of an entry point of the group `te_conformance.adapters` (an
installed package's adapter), or `package.module:Class`. The adapters themselves: te_fast.py,
torch_sdpa.py, flex_attention.py, transformer_engine.py (and te_ref.py, the judge, and
te_kernels.py, TE's softmax kernels as ops, which --impl does not select).
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest
import torch

from te_conformance.suites import devices, skips
from te_conformance.suites.adapters.base import CAPABILITIES, Adapter  # noqa: F401  (re-exported)
from te_conformance.suites.adapters.flex_attention import FlexAttention
from te_conformance.suites.adapters.te_fast import TeFast
from te_conformance.suites.adapters.torch_sdpa import TorchSdpa
from te_conformance.suites.adapters.transformer_engine import TransformerEngine

ADAPTERS: dict[str, Adapter] = {
    a.name: a for a in (TeFast(), TorchSdpa(), FlexAttention(), TransformerEngine())
}

# Installed packages register adapters here: `[project.entry-points."te_conformance.adapters"]`,
# `NAME = "package.module:Class"`; `--impl NAME` loads it.
ENTRY_POINT_GROUP = "te_conformance.adapters"

_loaded: dict[str, Adapter] = {}  # --impl spec -> its adapter: one instance per process


def entry_point_names() -> list[str]:
    """The names of the installed adapters' entry points (none is loaded)."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def _instance(obj, what: str) -> Adapter:
    """An Adapter instance from what a spec names: an Adapter subclass or instance."""
    if isinstance(obj, type) and issubclass(obj, Adapter):
        obj = obj()
    if not isinstance(obj, Adapter):
        raise pytest.UsageError(
            f"--impl {what}: {obj!r} is no suites.adapters.base.Adapter subclass (docs/adapters.md)"
        )
    if obj.name == Adapter.name:
        raise pytest.UsageError(f"--impl {what}: the adapter sets no `name`")
    old = obj.old_declarations()
    if old:
        raise pytest.UsageError(
            f"--impl {what}: {type(obj).__name__} declares its support the old way "
            f"({', '.join(old)}): declare it once, `support = Support(...)` "
            "(suites/adapters/support.py; docs/adapters.md, \"Declaring what it supports\")"
        )
    return obj


def _from_module(spec: str) -> Adapter:
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise pytest.UsageError(f"--impl {spec}: cannot import {module_name!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise pytest.UsageError(f"--impl {spec}: {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return _instance(obj, spec)


def _from_entry_point(name: str) -> Adapter | None:
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not eps:
        return None
    values = sorted({ep.value for ep in eps})
    if len(values) > 1:
        raise pytest.UsageError(
            f"--impl {name}: {len(values)} installed {ENTRY_POINT_GROUP!r} entry points have this "
            f"name ({', '.join(values)}); uninstall one, or name the class: --impl {values[0]}"
        )
    try:
        obj = eps[0].load()
    except Exception as e:  # the package's own import error, shown to the user
        raise pytest.UsageError(
            f"--impl {name}: entry point {name} = {values[0]} ({ENTRY_POINT_GROUP}) failed to "
            f"load: {type(e).__name__}: {e}"
        ) from e
    return _instance(obj, f"{name} (entry point {values[0]})")


def resolve(spec: str, pool: dict[str, Adapter] | None = None) -> Adapter:
    """The adapter an --impl value names: a registered name, an entry point's name in
    ENTRY_POINT_GROUP, or ``package.module:Class`` (an Adapter subclass or instance)."""
    pool = ADAPTERS if pool is None else pool
    if spec in pool:
        return pool[spec]
    if spec not in _loaded:
        adapter = _from_module(spec) if ":" in spec else _from_entry_point(spec)
        if adapter is None:
            known = sorted({*pool, *entry_point_names()})
            raise pytest.UsageError(
                f"--impl {[spec]}: unknown; known adapters: {known} (or give package.module:Class)"
            )
        _loaded[spec] = adapter
    return _loaded[spec]


def default_adapter() -> Adapter:
    """The adapter a check runs when given none: the first registered one marked default."""
    return next(a for a in ADAPTERS.values() if a.default)


def selected(config, pool: dict[str, Adapter] | None = None) -> list[Adapter]:
    """The adapters chosen with --impl (default: every adapter marked default)."""
    pool = ADAPTERS if pool is None else pool
    names = config.getoption("--impl") if config is not None else None
    if not names:
        return [a for a in pool.values() if a.default]
    adapters = [resolve(n, pool) for n in names]
    by_name: dict[str, list[str]] = {}
    for spec, adapter in zip(names, adapters):
        by_name.setdefault(adapter.name, []).append(spec)
    clashes = {n: specs for n, specs in by_name.items() if len(set(specs)) > 1}
    if clashes:
        raise pytest.UsageError(
            f"--impl: different adapters share a name (test ids would collide): {clashes}"
        )
    return list({a.name: a for a in adapters}.values())


def available(adapter: Adapter, device: str) -> torch.device:
    """The device, where this machine can run the adapter there (a CUDA device for a CUDA case,
    the implementation installed and built); else a skip of kind "environment" with why."""
    found = devices.require(device, needs_te_fast=False)  # te_fast's: its unavailable_reason
    skips.unless("environment", [adapter.unavailable_reason(device)])
    return found


def ready(adapter: Adapter, case=None, *needs: str, device: str | None = None) -> torch.device:
    """The one helper that applies an adapter's support declaration to the running test: the
    device (``device``, default the case's) where the case can be expressed (else a skip of kind
    "inexpressible"), the adapter takes the case with the capabilities ``needs`` there (else
    "declined", with the adapter's reasons) and this machine can run the adapter (else
    "environment": no CUDA device, the implementation not installed). A case the adapter
    declines is declined on every machine: what it supports does not depend on where it runs."""
    device = device or case.device
    if case is not None:
        skips.unless("inexpressible", [case.invalid_reason()])
    skips.unless("declined", adapter.declines(case, needs, device))
    return available(adapter, device)


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
