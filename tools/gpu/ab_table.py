"""tools/gpu/ab_table.py NAME=latest.json ...: several runs side by side, one column each (ab.sh).

For A/B calls (tools/gpu/ab.sh runs builds A and B interleaved, A1 B1 A2 B2 ...): one row per
case with each run's ratio (percent of the copy ceiling measured in that run; for module rows,
the speedup over the eager composite of the same run), then per build the median of its runs (a
build is a name without its trailing digits: A1, A2 -> A) and each build's change from the first
build's median, in points. Only te_fast's rows unless --impl says otherwise. A case missing from a
run, or not ok there, shows as "-" (and "!" after a WRONG/ERROR status).
Exit codes: 0 the table; 2 an unreadable file or a bad NAME=PATH.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

from benchmarks.compare import load, metric


def build_of(name: str) -> str:
    """The build a run belongs to: its name without trailing digits ("A12" -> "A")."""
    return re.sub(r"\d+$", "", name) or name


def cell(row: dict | None) -> tuple[str, float | None]:
    """(text, value in points or x) of one run's row."""
    if row is None or row.get("status") == "skipped":
        return "-", None
    m = metric(row)
    if row.get("status") != "ok" or m is None:
        return "-!", None
    value = 100 * m[1] if m[0] == "fraction_of_ceiling" else m[1]
    return (f"{value:.1f}" if m[0] == "fraction_of_ceiling" else f"{value:.2f}x"), value


def table(runs: dict[str, dict], impls: tuple[str, ...]) -> list[str]:
    """Markdown lines: case | each run | each build's median | each later build's change."""
    builds = list(dict.fromkeys(build_of(n) for n in runs))
    by_run = {n: {r["case"]: r for r in d["rows"]} for n, d in runs.items()}
    cases = list(
        dict.fromkeys(
            c
            for rows in by_run.values()
            for c, r in rows.items()
            if r.get("impl") in impls and metric(r) is not None
        )
    )
    head = ["case", *runs, *(f"{b} median" for b in builds)]
    head += [f"{b} - {builds[0]}" for b in builds[1:]]
    ceilings = ", ".join(
        f"{n} {d['ceiling_gbps']:.0f}" if d.get("ceiling_gbps") else f"{n} -"
        for n, d in runs.items()
    )
    lines = [f"copy ceilings (GB/s): {ceilings}"]
    smoke = [n for n, d in runs.items() if d.get("smoke")]
    if smoke:
        lines.append(f"smoke runs (their timings mean nothing): {', '.join(smoke)}")
    lines += ["", "| " + " | ".join(head) + " |"]
    lines.append("|" + "---|" * len(head))
    for case in cases:
        texts, medians = [], {}
        values: dict[str, list[float]] = {b: [] for b in builds}
        speedup = False  # module rows: x over the eager composite, else points of the ceiling
        for n in runs:
            row = by_run[n].get(case)
            text, value = cell(row)
            texts.append(text)
            if value is not None:
                values[build_of(n)].append(value)
                speedup = metric(row)[0] == "speedup"
        fmt, unit = (".2f", "x") if speedup else (".1f", "")
        for b in builds:
            medians[b] = statistics.median(values[b]) if values[b] else None
        texts += [f"{medians[b]:{fmt}}{unit}" if medians[b] is not None else "-" for b in builds]
        base = medians[builds[0]]
        for b in builds[1:]:
            ok = base is not None and medians[b] is not None
            texts.append(f"{medians[b] - base:+{fmt}}{unit}" if ok else "-")
        lines.append(f"| {case} | " + " | ".join(texts) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/gpu/ab_table.py", description=__doc__)
    p.add_argument("runs", nargs="+", metavar="NAME=PATH", help="a run's name and latest.json")
    p.add_argument("--impl", default="te_fast", help="impls whose rows to show (comma-separated)")
    args = p.parse_args(argv)
    runs = {}
    for arg in args.runs:
        name, sep, path = arg.partition("=")
        if not sep or not name or not path:
            print(f"ab: expected NAME=PATH, got {arg!r}", file=sys.stderr)
            return 2
        if name in runs:
            print(f"ab: the name {name!r} is given twice", file=sys.stderr)
            return 2
        try:
            runs[name] = load(path)
        except (OSError, ValueError) as exc:
            print(f"ab: {exc}", file=sys.stderr)
            return 2
    print("\n".join(table(runs, tuple(args.impl.split(",")))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
