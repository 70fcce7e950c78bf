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


def expected_on(item, **payload: Any) -> None:
    """Record on ``item`` (at collection, before it runs) an expected outcome the suites applied:
    ``source`` ("known_failure", "te_deviation", "declared": an adapter's declared difference),
    ``reason``, and where known ``adapter``, ``tensors`` (the tensors expected to fail),
    ``defined_at`` ("path:line" of the declaration). The report lists them by source and
    adapter; it never parses the xfail reason text."""
    item.user_properties.append((PROPERTY_KEY, {"kind": "expected", **_plain(payload)}))


def expected(**payload: Any) -> None:
    """``expected_on`` for the running test (an expected outcome decided at run time)."""
    _append("expected", _plain(payload))


def counters(**values: Any) -> None:
    """Compile counters: graph_breaks, cudagraph_skips, recompiles, graphs_recorded, ..."""
    _append("counters", {k: _plain(v) for k, v in values.items()})
