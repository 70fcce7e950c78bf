"""What a running test tells the report: case fields, compared tensors, compile counters."""

from __future__ import annotations

import contextlib
import math
from typing import Any

# The pytest item of the test that is running in this process (set by reports.plugin).
_current_item = None

# Key under which everything is stored in ``item.user_properties``; user_properties travel
# from xdist workers to the controller with each test report, so nothing is lost under -n.
PROPERTY_KEY = "te_conformance"


def set_current_item(item) -> None:
    global _current_item
    _current_item = item


def _append(kind: str, payload: dict[str, Any]) -> None:
    if _current_item is None:  # called outside pytest (a script, a benchmark): nothing to record
        return
    _current_item.user_properties.append((PROPERTY_KEY, {"kind": kind, **payload}))


def _plain(value):
    """Make a value JSON- and execnet-serialisable (xdist ships user_properties)."""
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


@contextlib.contextmanager
def suspended():
    """Record nothing inside the block (self-tests that feed the checks wrong values on purpose)."""
    global _current_item
    saved, _current_item = _current_item, None
    try:
        yield
    finally:
        _current_item = saved


def case(**fields: Any) -> None:
    """Describe the case: impl, layout, dtype, mask_type, shapes, ... (later calls update)."""
    _append("case", {k: _plain(v) for k, v in fields.items()})


def tensor(name: str, max_abs_err: float, bound: float, ratio: float, **extra: Any) -> None:
    """One compared tensor under the error-ratio rule: ratio = max_abs_err / bound (<= 1 passes)."""
    _append(
        "tensor",
        {
            "name": name,
            "max_abs_err": _plain(float(max_abs_err)),
            "bound": _plain(float(bound)),
            "ratio": _plain(float(ratio)),
            **{k: _plain(v) for k, v in extra.items()},
        },
    )


def features(*keys: str, replace: bool = False, declined: dict | None = None) -> None:
    """The features the running case exercises (the suites' catalogue keys; the report's
    ``features``, with those its test declares); ``replace``: instead of those recorded by
    earlier calls (the case that ran was another than the one first recorded); ``declined``:
    {feature: reason} of features the case asked for that the implementation turned away while
    the rest of the case ran without them (the report's ``declined_features``)."""
    payload = {"keys": [str(k) for k in keys], "replace": bool(replace)}
    if declined:
        payload["declined"] = [{"feature": str(k), "text": str(v)} for k, v in declined.items()]
    _append("features", payload)


def skip(kind: str, reasons: list[dict]) -> None:
    """Why the running case skips: ``kind`` ("declined": the implementation's adapter declines
    it; "environment": this machine lacks a device, a package or a build; "inexpressible": the
    combination does not exist) and ``reasons``, each {"text": ..., "feature": key or None}."""
    _append("skip", {"skip_kind": str(kind), "reasons": _plain(reasons)})


def counters(**values: Any) -> None:
    """Compile counters: graph_breaks, cudagraph_skips, recompiles, graphs_recorded, ..."""
    _append("counters", {k: _plain(v) for k, v in values.items()})
