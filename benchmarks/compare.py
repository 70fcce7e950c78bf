"""python -m benchmarks compare NEW OLD: flag every ratio that fell by more than 10%.

The ratios are normalised inside each run, so runs on different days or clocks compare fairly:
bandwidth rows by their fraction of the copy ceiling measured in the same run, module rows by
their speedup over the eager composite of the same run and configuration.
Exit codes: 0 nothing fell; 1 a ratio fell or a row that was ok is now WRONG/ERROR; 2 unreadable.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_THRESHOLD = 0.10


def metric(row: dict) -> tuple[str, float] | None:
    """(name, value) of the row's comparable ratio; None where it has none."""
    if row.get("section") == "ceiling":
        return None  # 100% by definition; its GB/s is the run's own yardstick
    for name in ("fraction_of_ceiling", "speedup"):
        value = row.get(name)
        if isinstance(value, (int, float)) and value > 0:
            return name, float(value)
    return None


@dataclass
class Comparison:
    fell: list[tuple[str, str, float, float]] = field(
        default_factory=list
    )  # case, metric, old, new
    broken: list[tuple[str, str, str]] = field(default_factory=list)  # case, old status, new
    improved: list[tuple[str, str, float, float]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in OLD, not compared in NEW
    added: list[str] = field(default_factory=list)
    compared: int = 0

    @property
    def failed(self) -> bool:
        return bool(self.fell or self.broken)


def load(path: str | Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: not a benchmark result (no 'rows' list)")
    for row in data["rows"]:
        if not isinstance(row, dict) or "case" not in row or "status" not in row:
            raise ValueError(f"{path}: a row without 'case'/'status': {row!r:.120}")
    return data


def compare(new: dict, old: dict, threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    result = Comparison()
    new_rows = {r["case"]: r for r in new["rows"]}
    old_rows = {r["case"]: r for r in old["rows"]}
    for case, o in old_rows.items():
        n = new_rows.get(case)
        if n is None or n["status"] == "skipped":
            if o["status"] != "skipped":
                result.missing.append(case)
            continue
        if o["status"] == "ok" and n["status"] != "ok":
            result.broken.append((case, o["status"], n["status"]))
            continue
        mo, mn = metric(o), metric(n)
        if mo is None or mn is None or o["status"] != "ok" or mo[0] != mn[0]:
            continue
        result.compared += 1
        if mn[1] < (1 - threshold) * mo[1]:
            result.fell.append((case, mo[0], mo[1], mn[1]))
        elif mn[1] > (1 + threshold) * mo[1]:
            result.improved.append((case, mo[0], mo[1], mn[1]))
    result.added = [c for c in new_rows if c not in old_rows]
    return result


def format_comparison(c: Comparison, threshold: float) -> str:
    lines = [f"compared {c.compared} ratios (threshold: a fall of more than {threshold:.0%})"]
    for case, name, old, new in c.fell:
        lines.append(f"FELL     {case}: {name} {old:.3f} -> {new:.3f} ({new / old - 1:+.1%})")
    for case, old, new in c.broken:
        lines.append(f"BROKEN   {case}: {old} -> {new}")
    for case, name, old, new in c.improved:
        lines.append(f"improved {case}: {name} {old:.3f} -> {new:.3f} ({new / old - 1:+.1%})")
    if c.missing:
        lines.append(f"not in NEW (not compared): {len(c.missing)}, e.g. {c.missing[:3]}")
    if c.added:
        lines.append(f"new in NEW: {len(c.added)}")
    lines.append("verdict: " + ("FAIL" if c.failed else "ok"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks compare", description=__doc__)
    parser.add_argument("new", help="latest.json of the run to judge")
    parser.add_argument("old", help="latest.json of the run to compare with")
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="flag a ratio that fell by more than this fraction (default 0.10)",
    )
    args = parser.parse_args(argv)
    try:
        new, old = load(args.new), load(args.old)
    except (OSError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    for name, data in (("NEW", new), ("OLD", old)):
        if data.get("smoke"):
            print(
                f"compare: warning: {name} is a smoke run (its timings mean nothing)",
                file=sys.stderr,
            )
    c = compare(new, old, args.threshold)
    print(format_comparison(c, args.threshold))
    return 1 if c.failed else 0
