"""Compare a new report with a baseline: regressions gate the release, the rest is information."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reports.model import (
    FAILING,
    WHOLE,
    Scope,
    fmt_ratio,
    run_scope,
    worst_ratio,
    worst_tensor,
)

# name -> (title, whether it is a regression)
CATEGORIES = {
    "new_failures": ("new failures", True),  # new cases that fail or error included
    "lost_coverage": ("lost coverage (passed -> skipped or xfailed)", True),
    "ratio_regressions": ("ratio regressions", True),
    "non_finite": ("non-finite ratios (NaN/inf worst ratio in a passing case)", True),
    "lost_checks": ("lost checks (compared tensors in the baseline, none now)", True),
    "missing": ("missing cases (in the baseline, not in this run)", True),
    "improvements": ("improvements", False),
    "new_cases": ("new cases", False),
    "excused_failures": ("failures now expected (failed -> xfailed: not fixed)", False),
    "still_xfailed": ("still expected failures (xfailed in both)", False),
    "dropped_skips": ("gone cases that were skipped in the baseline", False),
    "still_failing": ("still failing (failed in the baseline too)", False),
}
# the categories that lose coverage: --update-baseline refuses them without --accept-loss
COVERAGE_LOSS = ("lost_coverage", "missing")
DEFAULT_FACTOR = 1.5
DEFAULT_MIN_RATIO = 0.05


@dataclass
class Comparison:
    """Per category, (nodeid, detail) pairs sorted by nodeid."""

    items: dict[str, list[tuple[str, str]]] = field(
        default_factory=lambda: {name: [] for name in CATEGORIES}
    )
    scope: Scope = WHOLE  # the new run's scope: what was compared
    not_compared: int = 0  # baseline cases outside that scope (not selected, other paths)

    @property
    def coverage_loss(self) -> list[tuple[str, str]]:
        """Cases whose coverage this run lost (passed -> skipped, missing)."""
        return [item for name in COVERAGE_LOSS for item in self.items[name]]

    @property
    def regressions(self) -> int:
        """How many cases regressed (all categories that gate)."""
        return sum(len(self.items[n]) for n, (_, gate) in CATEGORIES.items() if gate)

    @property
    def news(self) -> int:
        """Improvements and new cases: what --update-baseline would accept."""
        return len(self.items["improvements"]) + len(self.items["new_cases"])


def _ratio_text(case: dict) -> str:
    t = worst_tensor(case)
    return f"{fmt_ratio(worst_ratio(case))} ({t.get('name', '?')})" if t else "-"


def compare(
    new: dict,
    base: dict,
    factor: float = DEFAULT_FACTOR,
    min_ratio: float = DEFAULT_MIN_RATIO,
    scope: Scope | None = None,
) -> Comparison:
    """Classify every nodeid of new and base (see CATEGORIES); ratios compare worst per case.

    Only the baseline cases in the new run's scope (run_scope(new), or `scope`) are compared: a
    subset run (-k, -m, paths, a shard) answers for the cases it ran, a full run for every
    baseline case under its paths. A ratio change counts only above min_ratio: at tiny ratios a
    x1.5 swing is noise. Details name outcomes and ratios, never the failure text (the report's
    failure section shows it once).
    """
    scope = run_scope(new) if scope is None else scope
    new_cases = {c["nodeid"]: c for c in new["cases"]}
    base_all = {c["nodeid"]: c for c in base["cases"]}
    if scope.complete:
        base_cases = {k: c for k, c in base_all.items() if scope.covers(k)}
    else:
        base_cases = {k: c for k, c in base_all.items() if k in new_cases}
    result = Comparison(scope=scope, not_compared=len(base_all) - len(base_cases))
    add = lambda cat, nodeid, detail: result.items[cat].append((nodeid, detail))

    for nodeid in sorted(new_cases.keys() | base_cases.keys()):
        n, b = new_cases.get(nodeid), base_cases.get(nodeid)
        if n is None:
            b_out = b["outcome"]
            cat = "dropped_skips" if b_out in ("skipped", "xfailed") else "missing"
            add(cat, nodeid, f"was {b_out}")
            continue
        n_out = n["outcome"]
        nr = worst_ratio(n)
        if b is None:
            if n_out in FAILING:  # a case that appears failing is a new failure, not news
                add("new_failures", nodeid, f"new case, {n_out}")
            elif n_out == "passed" and nr is not None and math.isinf(nr):
                add("non_finite", nodeid, f"new case, worst ratio {_ratio_text(n)}")
            else:
                add("new_cases", nodeid, n_out)
            continue
        b_out = b["outcome"]
        if n_out in FAILING:
            if b_out in FAILING:
                add("still_failing", nodeid, f"{b_out} -> {n_out}")
            else:
                add("new_failures", nodeid, f"{b_out} -> {n_out}")
        elif b_out == "passed" and n_out in ("skipped", "xfailed"):
            add("lost_coverage", nodeid, f"passed -> {n_out}: {n.get('skip_reason') or '-'}")
        elif b_out in FAILING and n_out == "xfailed":
            add("excused_failures", nodeid, f"{b_out} -> xfailed: {n.get('skip_reason') or '-'}")
        elif b_out == n_out == "xfailed":
            old, now = b.get("skip_reason") or "-", n.get("skip_reason") or "-"
            add("still_xfailed", nodeid, now if old == now else f"reason was: {old}; now: {now}")
        elif b_out in FAILING or (b_out in ("skipped", "xfailed") and n_out == "passed"):
            add("improvements", nodeid, f"{b_out} -> {n_out}")
        elif b_out == "xfailed" and n_out == "xpassed":
            add("improvements", nodeid, "xfailed -> xpassed (the known failure passes)")
        elif b_out == n_out == "passed":
            br = worst_ratio(b)
            if nr is not None and math.isinf(nr):
                add("non_finite", nodeid, f"worst ratio {_ratio_text(b)} -> {_ratio_text(n)}")
                continue
            if br is not None and nr is None:
                add("lost_checks", nodeid, f"worst ratio {_ratio_text(b)} -> no tensor compared")
                continue
            if nr is None or br is None:
                continue
            change = f"worst ratio {_ratio_text(b)} -> {_ratio_text(n)}"
            if nr > min_ratio and nr > factor * br:
                growth = f", x{nr / br:.2g}" if br > 0 and math.isfinite(br) else ""
                add("ratio_regressions", nodeid, change + growth)
            elif br > min_ratio and nr * factor < br:
                add("improvements", nodeid, change)
    return result


def format_comparison(result: Comparison, new_label: str, base_label: str, limit: int = 20) -> str:
    """A short text summary: counts per category, then the first `limit` items of each."""
    counts = ", ".join(
        f"{len(result.items[n])} {title.split(' (')[0]}"
        for n, (title, _) in CATEGORIES.items()
        if result.items[n]
    )
    lines = [
        f"Comparison of {new_label} against baseline {base_label}:",
        f"  {result.scope.describe()}",
        f"  {counts or 'same cases, same outcomes'}",
    ]
    if result.not_compared:
        why = "not selected by this run" if not result.scope.complete else "outside its paths"
        lines.append(f"  {result.not_compared} baseline case(s) not compared ({why})")
    for name, (title, gate) in CATEGORIES.items():
        items = result.items[name]
        if not items:
            continue
        lines.append(f"{'REGRESSION' if gate else 'info'}: {title}: {len(items)}")
        lines += [f"  {nodeid}  {detail}" for nodeid, detail in items[:limit]]
        if len(items) > limit:
            lines.append(f"  ... and {len(items) - limit} more")
    verdict = (
        f"{result.regressions} regression(s)"
        if result.regressions
        else "no regressions against the baseline"
    )
    lines.append(verdict)
    return "\n".join(lines)
