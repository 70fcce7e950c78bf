"""Compare a new report with a baseline: regressions gate the release, the rest is information."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reports.model import FAILING, fmt_ratio, worst_ratio, worst_tensor

# name -> (title, whether it is a regression)
CATEGORIES = {
    "new_failures": ("new failures", True),
    "lost_coverage": ("lost coverage (passed -> skipped)", True),
    "ratio_regressions": ("ratio regressions", True),
    "missing": ("missing cases (in the baseline, not in this run)", True),
    "improvements": ("improvements", False),
    "new_cases": ("new cases", False),
    "dropped_skips": ("gone cases that were skipped in the baseline", False),
    "still_failing": ("still failing (failed in the baseline too)", False),
}
DEFAULT_FACTOR = 1.5
DEFAULT_MIN_RATIO = 0.05


@dataclass
class Comparison:
    """Per category, (nodeid, detail) pairs sorted by nodeid."""

    items: dict[str, list[tuple[str, str]]] = field(
        default_factory=lambda: {name: [] for name in CATEGORIES}
    )

    @property
    def regressions(self) -> int:
        """How many cases regressed (all categories that gate)."""
        return sum(len(self.items[n]) for n, (_, gate) in CATEGORIES.items() if gate)

    @property
    def news(self) -> int:
        """Improvements and new cases: what --update-baseline would accept."""
        return len(self.items["improvements"]) + len(self.items["new_cases"])


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0][:200]


def _ratio_text(case: dict) -> str:
    t = worst_tensor(case)
    return f"{fmt_ratio(worst_ratio(case))} ({t.get('name', '?')})" if t else "-"


def compare(
    new: dict, base: dict, factor: float = DEFAULT_FACTOR, min_ratio: float = DEFAULT_MIN_RATIO
) -> Comparison:
    """Classify every nodeid of new and base (see CATEGORIES); ratios compare worst per case.

    A ratio change counts only above min_ratio: at tiny ratios a x1.5 swing is noise.
    """
    new_cases = {c["nodeid"]: c for c in new["cases"]}
    base_cases = {c["nodeid"]: c for c in base["cases"]}
    result = Comparison()
    add = lambda cat, nodeid, detail: result.items[cat].append((nodeid, detail))

    for nodeid in sorted(new_cases.keys() | base_cases.keys()):
        n, b = new_cases.get(nodeid), base_cases.get(nodeid)
        if b is None:
            n_out = n["outcome"]
            if n_out in FAILING:  # a case that appears failing is a new failure, not news
                add("new_failures", nodeid, f"new case, {n_out}: {_first_line(n['message'])}")
            else:
                add("new_cases", nodeid, n_out)
            continue
        b_out = b["outcome"]
        if n is None:
            cat = "dropped_skips" if b_out in ("skipped", "xfailed") else "missing"
            add(cat, nodeid, f"was {b_out}")
            continue
        n_out = n["outcome"]
        if n_out in FAILING:
            if b_out in FAILING:
                add("still_failing", nodeid, _first_line(n["message"]))
            else:
                add("new_failures", nodeid, f"{b_out} -> {n_out}: {_first_line(n['message'])}")
        elif b_out == "passed" and n_out in ("skipped", "xfailed"):
            add("lost_coverage", nodeid, f"passed -> {n_out}: {n.get('skip_reason') or '-'}")
        elif b_out in FAILING or (b_out in ("skipped", "xfailed") and n_out == "passed"):
            add("improvements", nodeid, f"{b_out} -> {n_out}")
        elif b_out == n_out == "passed":
            nr, br = worst_ratio(n), worst_ratio(b)
            if nr is None or br is None:
                continue
            change = f"worst ratio {_ratio_text(b)} -> {_ratio_text(n)}"
            if nr > min_ratio and (nr > factor * br or math.isinf(nr)):
                growth = f", x{nr / br:.2g}" if br > 0 and math.isfinite(nr) else ""
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
        f"  {counts or 'same cases, same outcomes'}",
    ]
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
