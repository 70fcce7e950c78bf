"""Merge the reports of several shards into one report."""

from __future__ import annotations

import json
import re

from te_conformance.reports.model import ReportError, build_report, interrupted


def _shard(source: str, report: dict) -> tuple[int, int]:
    """(i, n) of a shard report's --te-shard i/n, or a ReportError."""
    text = str(report["environment"].get("shard") or "")
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ReportError(
            f"{source} is not a shard report (its environment.shard is {text or 'empty'!r}; "
            "shards come from pytest --te-shard i/n)"
        )
    return int(m[1]), int(m[2])


def check_shards(reports: list[tuple[str, dict]]) -> None:
    """Every shard of one split, once: the same n everywhere, each i of 1..n present exactly once
    (a merge that lacks a shard would be a partial run that looks whole)."""
    shards = [(source, *_shard(source, r)) for source, r in reports]
    counts = sorted({n for _, _, n in shards})
    if len(counts) > 1:
        listed = ", ".join(f"{source}: {i}/{n}" for source, i, n in shards)
        raise ReportError(f"the shards come from different splits ({listed})")
    n = counts[0]
    seen: dict[int, str] = {}
    for source, i, _ in shards:
        if i in seen:
            raise ReportError(f"shard {i}/{n} is given twice ({seen[i]} and {source})")
        seen[i] = source
    missing = [f"{i}/{n}" for i in range(1, n + 1) if i not in seen]
    if missing:
        raise ReportError(
            f"shard(s) {', '.join(missing)} missing: a merge needs all {n} shards of the split "
            f"(got {len(seen)})"
        )


def merge_reports(reports: list[tuple[str, dict]]) -> dict:
    """Union of the cases of (source, report) pairs: every shard of one --te-shard split, no
    nodeid in two shards (ReportError otherwise)."""
    if not reports:
        raise ReportError("nothing to merge")
    check_shards(reports)
    seen: dict[str, str] = {}
    cases: list[dict] = []
    shards = []
    for source, report in reports:
        for case in report["cases"]:
            if case["nodeid"] in seen:
                raise ReportError(
                    f"{case['nodeid']} is in both {seen[case['nodeid']]} and {source}: "
                    "shards must not overlap (were they run with the same --te-shard?)"
                )
            seen[case["nodeid"]] = source
            cases.append(case)
        e = report["environment"]
        shards.append(
            {
                "source": source,
                "shard": e.get("shard"),
                "hostname": e.get("hostname"),
                "git_commit": e.get("git_commit"),
                "machine_class": e.get("machine_class"),
                "selection": e.get("selection"),
                "fingerprint": e.get("fingerprint"),
                "date_utc": e.get("date_utc"),
                "cases": len(report["cases"]),
                "duration_s": report["summary"].get("duration_s"),
            }
        )
    environment = {**reports[0][1]["environment"], "shard": None, "shards": shards}
    # shards of several machines have no one fingerprint: their ratios gate against none
    if len({json.dumps(s["fingerprint"], sort_keys=True) for s in shards}) > 1:
        environment["fingerprint"] = None
    # the whole split ran what each shard selected; shards that selected differently are a subset
    selections = [r["environment"].get("selection") for _, r in reports]
    if any(s != selections[0] for s in selections):
        environment["selection"] = {**(selections[0] or {}), "mixed": True}
    # Shards run side by side, so the wall time of the whole is the slowest shard's.
    durations = [s["duration_s"] for s in shards if isinstance(s["duration_s"], (int, float))]
    # A shard that was stopped early makes the whole partial.
    stopped = [f"{source}: {interrupted(r)}" for source, r in reports if interrupted(r)]
    # (a whole shard collected what it reports)
    collected = [
        r["summary"].get("collected") if interrupted(r) else len(r["cases"]) for _, r in reports
    ]
    return build_report(
        cases,
        environment,
        max(durations) if durations else None,
        interrupted="; ".join(stopped) or None,
        collected=sum(collected) if stopped and None not in collected else None,
    )


def inconsistencies(merged: dict) -> list[str]:
    """Warnings for shards that should not be merged silently (other commit, other machine)."""
    shards = merged["environment"].get("shards", [])
    warnings = []
    for key in ("git_commit", "machine_class", "selection", "fingerprint"):
        values = sorted({json.dumps(s.get(key), sort_keys=True) for s in shards if key in s})
        if len(values) > 1:
            warnings.append(f"shards differ in {key}: {', '.join(values)}")
    return warnings
