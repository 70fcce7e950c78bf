"""Merge the reports of several shards into one report."""

from __future__ import annotations

from reports.model import ReportError, build_report, interrupted


def merge_reports(reports: list[tuple[str, dict]]) -> dict:
    """Union of the cases of (source, report) pairs; a nodeid in two shards is a ReportError."""
    if not reports:
        raise ReportError("nothing to merge")
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
                "date_utc": e.get("date_utc"),
                "cases": len(report["cases"]),
                "duration_s": report["summary"].get("duration_s"),
            }
        )
    environment = {**reports[0][1]["environment"], "shard": None, "shards": shards}
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
    for key in ("git_commit", "machine_class"):
        values = sorted({str(s.get(key)) for s in shards})
        if len(values) > 1:
            warnings.append(f"shards differ in {key}: {', '.join(values)}")
    return warnings
