"""Expected outcomes, one mechanism: a test that must fail in a known, understood way.

Three sources give expectations, all applied by one hook (``pytest_runtest_makereport`` in
suites/plugin.py, through ``settle`` below):

- ``known_failure``: suites/known_failures.py, by case key, at collection;
- ``declared``: an adapter's declared differences (``Adapter.differences``, matched at
  collection) and what its per-case hook names at run time (``Adapter.known_deviations``);
- ``te_deviation``: Transformer Engine's recorded departures (suites/te_deviations.py), named
  at run time by the transformer_engine adapter's per-case hook, and TE's own softmax kernels'
  (suites/te_fast/test_te_kernels.py).

An expectation is STRICT and NARROW: the test must fail, and every failure must be a check it
explains (a ``CheckError`` of one of its ``checks`` kinds, on one of its ``tensors``; an
``exact`` expectation needs each of its tensors to fail too); then the test is an expected
failure (xfailed). A failure nothing explains (another tensor or check, an exception of the run)
fails the test, and so does a pass (XPASS(strict): the difference no longer shows), unless
every expectation applied is ``strict=False`` (machine-dependent rounding), where a pass is an
xpass. Each expectation applied is recorded for the report with its source, id, tensors,
reason, where it is defined and its reproducer; the report reads those records alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from te_conformance.suites.checks.failures import VALUE_CHECKS, CheckError, failures_of

# What a runtime deviation explains unless it says otherwise (an ``explains`` attribute): the
# value checks of a judged case (SPEC §6's ratio, the exact zeros), the mask table's grids and a
# call the standard refuses that returned (CheckError kinds "table" and "refusal").
DEVIATION_EXPLAINS = (*VALUE_CHECKS, "table", "refusal")


@dataclass(frozen=True)
class Expectation:
    """One expected failure. ``checks``: the CheckError kinds it explains, each either a kind
    ("ratio") or a kind on one tensor ("dtype:max_logit"); ``tensors``: the tensors it may fail
    on (empty: any); ``exact``: every one of ``tensors`` must fail (a known failure names
    exactly the tensors that fail). ``id`` is stable (a known failure's case key, a deviation's
    id); ``defined_at`` is "path:line" of its declaration; ``reproducer`` a command that shows
    it, where there is one; ``title`` and ``where`` (source lines of the implementation) for
    deviations."""

    source: str
    id: str
    reason: str
    checks: tuple[str, ...] = VALUE_CHECKS
    tensors: tuple[str, ...] = ()
    exact: bool = False
    strict: bool = True
    adapter: str | None = None
    title: str | None = None
    where: str | None = None
    defined_at: str | None = None
    reproducer: str | None = None
    max_ratio: float | None = None  # a ratio failure above it is not this difference
    extra: dict = field(default_factory=dict, compare=False)

    def explains(self, failure: BaseException) -> bool:
        """Whether this expectation explains one failure (a CheckError of its checks on one of
        its tensors, and for a ratio failure under ``max_ratio`` where it has one; nothing else
        ever is)."""
        if not isinstance(failure, CheckError):
            return False
        if self.tensors and failure.tensor not in self.tensors:
            return False
        if self.max_ratio is not None and failure.kind == "ratio":
            ratio = getattr(failure, "ratio", None)
            if ratio is None or not ratio <= self.max_ratio:  # NaN and untold ratios too
                return False
        return bool({failure.kind, f"{failure.kind}:{failure.tensor}"} & set(self.checks))

    def label(self) -> str:
        """How the xfail reason names it."""
        head = {"known_failure": "known failure", "declared": "declared difference",
                "te_deviation": "TE deviation"}.get(self.source, self.source)  # fmt: skip
        who = f" of {self.adapter}" if self.adapter and self.source == "declared" else ""
        what = f" {self.id}" if self.source == "te_deviation" else ""
        on = f" ({','.join(self.tensors)})" if self.tensors else ""
        if self.max_ratio is not None:
            on += f" [ratio <= {self.max_ratio:g}]"
        how = "" if self.strict else " [not strict: machine-dependent rounding]"
        return f"{head}{who}{what}{on}: {self.title or self.reason}{how}"

    def record(self) -> dict:
        """What the report keeps of it."""
        out = {
            "source": self.source, "id": self.id, "reason": self.reason,
            "checks": list(self.checks), "tensors": list(self.tensors), "strict": self.strict,
        }  # fmt: skip
        for name in ("adapter", "title", "where", "defined_at", "reproducer", "max_ratio"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return {**out, **self.extra}


def from_deviation(deviation, adapter: str | None) -> Expectation:
    """The expectation of what an adapter's per-case hook (``Adapter.known_deviations``)
    returns: an Expectation as it is, else an object with ``id`` and ``reason`` (or its str)
    and optionally ``explains``, ``title``, ``te_lines``/``where``, ``reproducer``,
    ``source`` (default "declared")."""
    if isinstance(deviation, Expectation):
        return deviation
    if hasattr(deviation, "expectation"):
        return deviation.expectation(adapter)
    reason = getattr(deviation, "reason", None) or str(deviation)
    return Expectation(
        source=getattr(deviation, "source", "declared"),
        id=str(getattr(deviation, "id", reason[:60])),
        reason=reason,
        checks=tuple(getattr(deviation, "explains", DEVIATION_EXPLAINS)),
        adapter=adapter,
        title=getattr(deviation, "title", None),
        where=getattr(deviation, "te_lines", None) or getattr(deviation, "where", None),
        reproducer=getattr(deviation, "reproducer_command", None),
    )


# ----------------------------------------------------------------------------- per item

_current: list = []  # the item running in this process (suites/plugin.py sets it)


def set_current(item) -> None:
    _current[:] = [item] if item is not None else []


def attach(item, *expectations: Expectation) -> None:
    """Expect these failures of ``item`` (at collection, or while it runs)."""
    found = item.stash.setdefault(_KEY, [])
    found += [e for e in expectations if e not in found]


def expect(*expectations: Expectation) -> None:
    """Expect these failures of the running test (those an adapter's hook names for its case);
    nothing outside a test (a script calling the checks)."""
    if _current and expectations:
        attach(_current[0], *expectations)


_REPRODUCER = pytest.StashKey[str]()


def note_reproducer(command: str) -> None:
    """The command that shows the running test's failure on its own (a fuzz check's shrunk
    example): the latest one noted is recorded with the case when its call fails
    (suites/plugin.py), as the report's ``reproducer``; nothing outside a test."""
    if _current:
        _current[0].stash[_REPRODUCER] = command


def reproducer_of(item) -> str | None:
    return item.stash.get(_REPRODUCER, None)


def of(item) -> list[Expectation]:
    """The expectations attached to ``item``."""
    return list(item.stash.get(_KEY, []))


_KEY = pytest.StashKey[list]()


@dataclass
class Verdict:
    """What the expectations make of one call: ``outcome`` "xfailed", "xpassed", "failed" (a
    strict expectation that did not occur, or a failure none explains) or None (no
    expectation: the call's own outcome); ``reason``, and the text that says why it failed."""

    outcome: str | None
    reason: str = ""
    why: str = ""


def settle(expectations: list[Expectation], error: BaseException | None) -> Verdict:
    """The outcome of a call that raised ``error`` (None: it passed) under ``expectations``."""
    if not expectations:
        return Verdict(None)
    reason = "; ".join(e.label() for e in expectations)
    if error is None:
        if any(e.strict for e in expectations):
            return Verdict("failed", reason, "[XPASS(strict)] the expected failure did not "
                           f"occur (the difference no longer shows): {reason}")  # fmt: skip
        return Verdict("xpassed", reason)
    failures = failures_of(error)
    unexplained = [f for f in failures if not any(e.explains(f) for e in expectations)]
    failed = {(f.kind, f.tensor) for f in failures if isinstance(f, CheckError)}
    missing = [
        f"{e.label()}: {t} did not fail"
        for e in expectations if e.exact
        for t in e.tensors if not any(tensor == t for _, tensor in failed)
    ]  # fmt: skip
    if not unexplained and not missing:
        return Verdict("xfailed", reason)
    lines = [f"{type(f).__name__}: {str(f).splitlines()[0][:160] if str(f) else ''}"
             for f in unexplained] + missing  # fmt: skip
    return Verdict("failed", reason, "not explained by the expected differences (" + reason
                   + "):\n  " + "\n  ".join(lines))  # fmt: skip
