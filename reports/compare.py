"""Compare a new report with a baseline: regressions gate the release, the rest is information."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from te_conformance.reports import baseline, env
from te_conformance.reports.baseline import Baseline, Entry
from te_conformance.reports.model import FAILING, WHOLE, Scope, SelectionError, fmt_ratio, run_scope

# name -> (title, whether it is a regression)
CATEGORIES = {
    "new_failures": ("new failures", True),  # new cases that fail or error included
    "lost_coverage": ("lost coverage (any outcome -> skipped, passed -> xfailed)", True),
    "ratio_regressions": ("ratio regressions", True),
    "non_finite": ("non-finite ratios (NaN/inf worst ratio in a passing case)", True),
    "lost_checks": ("lost checks (tensors compared in the baseline, not now)", True),
    "fewer_examples": ("fewer fuzz examples (a smaller budget than the baseline's)", True),
    "missing": ("missing cases (in the baseline and selected, not in this run)", True),
    "improvements": ("improvements", False),
    "drift": ("ratio drift (another machine fingerprint: not gated)", False),
    "new_cases": ("new cases", False),
    "excused_failures": ("failures now expected (failed -> xfailed: not fixed)", False),
    "still_xfailed": ("still expected failures (xfailed in both)", False),
    "dropped_skips": ("gone cases that were skipped in the baseline", False),
    "still_failing": ("still failing (failed in the baseline too)", False),
}
# the categories that lose coverage: --update-baseline refuses them without --accept-loss
COVERAGE_LOSS = ("lost_coverage", "missing", "lost_checks", "fewer_examples")
SKIPPED = ("skipped", "xfailed")
DEFAULT_FACTOR = 1.5
DEFAULT_MIN_RATIO = 0.05


@dataclass
class Comparison:
    """Per category, (nodeid, detail) pairs sorted by case key."""

    items: dict[str, list[tuple[str, str]]] = field(
        default_factory=lambda: {name: [] for name in CATEGORIES}
    )
    scope: Scope = WHOLE  # the new run's scope: what was compared
    not_compared: int = 0  # baseline cases outside that scope (not selected, other paths)
    same_machine: bool = True  # the two fingerprints are equal: ratio growth gates
    machine_note: str = ""  # what differs between them, when they differ

    @property
    def coverage_loss(self) -> list[tuple[str, str]]:
        """Cases whose coverage this run lost (-> skipped, missing, fewer checks or examples)."""
        return [item for name in COVERAGE_LOSS for item in self.items[name]]

    @property
    def regressions(self) -> int:
        """How many cases regressed (all categories that gate)."""
        return sum(len(self.items[n]) for n, (_, gate) in CATEGORIES.items() if gate)

    @property
    def news(self) -> int:
        """Improvements and new cases: what --update-baseline would accept."""
        return len(self.items["improvements"]) + len(self.items["new_cases"])


def _ratio_text(e: Entry) -> str:
    return f"{fmt_ratio(e.ratio)} ({e.tensor or '?'})" if e.ratio is not None else "-"


def _base_in_scope(scope: Scope, base: dict[str, Entry], new: dict[str, Entry]) -> dict:
    """The baseline entries this run answers for: under a full run's paths; selected by a
    subset run's selection (or, where it cannot be applied to recorded cases, those it ran)."""
    if scope.complete:
        return {k: e for k, e in base.items() if scope.covers(e.nodeid)}
    try:
        return {k: e for k, e in base.items()
                if k in new or scope.selects(e.nodeid, k, e.marks, e.keywords)}  # fmt: skip
    except SelectionError:
        return {k: e for k, e in base.items() if k in new}


def compare(
    new: dict,
    base,
    factor: float = DEFAULT_FACTOR,
    min_ratio: float = DEFAULT_MIN_RATIO,
    scope: Scope | None = None,
) -> Comparison:
    """Classify every case of the new report and of the baseline (a reports.baseline.Baseline,
    or a report read as one) by case key (see CATEGORIES); ratios compare worst per case.

    Only the baseline cases in the new run's scope (run_scope(new), or `scope`) are compared: a
    full run answers for every baseline case under its paths, a subset run (-k, -m, paths, a
    shard) for every baseline case its selection selects. A pass or a failure is the case's
    own (SPEC 6: ratio <= 1); against the baseline, a regression is a change of outcome
    (passed -> failed, error, xfailed or missing; any outcome -> skipped), a compared tensor
    no longer compared, or a fuzz case that drew fewer examples. Ratio growth gates only
    between runs of one machine fingerprint (reports.env): elsewhere the CPU's or GPU's kernels
    round differently, and the change is listed as drift.
    A ratio change counts only above min_ratio: at tiny ratios a x1.5 swing is noise. Details
    name outcomes and ratios, never the failure text (the report's failure section shows it).
    """
    if not isinstance(base, Baseline):
        base = baseline.parse(base, "baseline")
    scope = run_scope(new) if scope is None else scope
    new_cases = baseline.entries_of_report(new)
    base_cases = _base_in_scope(scope, base.entries, new_cases)
    new_fp = new["environment"].get("fingerprint")
    same = env.same_fingerprint(new_fp, base.fingerprint)
    result = Comparison(scope=scope, not_compared=len(base.entries) - len(base_cases),
                        same_machine=same,
                        machine_note="" if same else env.fingerprint_difference(
                            new_fp, base.fingerprint))  # fmt: skip
    add = lambda cat, e, detail: result.items[cat].append((e.nodeid, detail))
    ratio_cat = {True: ("ratio_regressions", "improvements"), False: ("drift", "drift")}[same]

    for key in sorted(new_cases.keys() | base_cases.keys()):
        n, b = new_cases.get(key), base_cases.get(key)
        if n is None:
            cat = "dropped_skips" if b.outcome in SKIPPED else "missing"
            add(cat, b, f"was {b.outcome}")
            continue
        nr = n.ratio
        if b is None:
            if n.outcome in FAILING:  # a case that appears failing is a new failure, not news
                add("new_failures", n, f"new case, {n.outcome}")
            elif n.outcome == "passed" and nr is not None and math.isinf(nr):
                add("non_finite", n, f"new case, worst ratio {_ratio_text(n)}")
            else:
                add("new_cases", n, n.outcome)
            continue
        if n.outcome in FAILING:
            if b.outcome in FAILING:
                add("still_failing", n, f"{b.outcome} -> {n.outcome}")
            else:
                add("new_failures", n, f"{b.outcome} -> {n.outcome}")
        elif (n.outcome == "skipped" and b.outcome != "skipped") or (
            b.outcome == "passed" and n.outcome == "xfailed"
        ):  # a skip judges nothing, whatever the case did before (a failure it now hides too)
            add("lost_coverage", n, f"{b.outcome} -> {n.outcome}: {n.reason or '-'}")
        elif b.outcome in FAILING and n.outcome == "xfailed":
            add("excused_failures", n, f"{b.outcome} -> xfailed: {n.reason or '-'}")
        elif b.outcome == n.outcome == "xfailed":
            old, now = b.reason or "-", n.reason or "-"
            add("still_xfailed", n, now if old == now else f"reason was: {old}; now: {now}")
        elif b.outcome in FAILING or (b.outcome in SKIPPED and n.outcome == "passed"):
            add("improvements", n, f"{b.outcome} -> {n.outcome}")
        elif b.outcome == "xfailed" and n.outcome == "xpassed":
            add("improvements", n, "xfailed -> xpassed (the known failure passes)")
        elif b.outcome == n.outcome == "passed":
            if nr is not None and math.isinf(nr):
                add("non_finite", n, f"worst ratio {_ratio_text(b)} -> {_ratio_text(n)}")
                continue
            lost = sorted(set(b.checked) - set(n.checked))
            if lost or (b.ratio is not None and nr is None):
                add("lost_checks", n, f"no longer compared: {', '.join(lost) or 'any tensor'}")
                continue
            if b.examples is not None and (n.examples or 0) < b.examples:
                now = "none recorded" if n.examples is None else str(n.examples)
                add("fewer_examples", n, f"fuzz examples {b.examples} -> {now}")
                continue
            br = b.ratio
            if nr is None or br is None:
                continue
            change = f"worst ratio {_ratio_text(b)} -> {_ratio_text(n)}"
            if nr > min_ratio and nr > factor * br:
                growth = f", x{nr / br:.2g}" if br > 0 and math.isfinite(br) else ""
                add(ratio_cat[0], n, change + growth)
            elif br > min_ratio and nr * factor < br:
                add(ratio_cat[1], n, change)
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
    if not result.same_machine:
        lines.append(
            f"  another machine fingerprint ({result.machine_note}): ratio growth is drift, "
            "listed, not gated; outcomes gate as always"
        )
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
