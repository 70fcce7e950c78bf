"""Command line: python -m te_conformance run | compare | merge | rename | render | screenshot |
matrix."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import signal
import subprocess
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from te_conformance.reports import baseline as reports_baseline
from te_conformance.reports import env
from te_conformance.reports.compare import (
    CATEGORIES,
    DEFAULT_FACTOR,
    DEFAULT_MIN_RATIO,
    WHOLE,
    Comparison,
    compare,
    format_comparison,
)
from te_conformance.reports.merge import inconsistencies, merge_reports
from te_conformance.reports.model import (
    DEFAULT_IMPL,
    DEFAULT_SCOPE,
    ReportError,
    failures,
    interrupted,
    load_report,
    run_scope,
    write_report,
)
from te_conformance.reports.render import (
    adapter_counts,
    expected_rows,
    fingerprint_text,
    outcome_counts,
    render,
    summary_line,
)
from te_conformance.reports.verdict import Verdict

BASELINE_DIR = Path("reports/baseline")
EPILOG = """\
examples:
  python -m te_conformance run                          run the suites (-n auto), render, gate
  python -m te_conformance run -- -k bf16 -x            everything after -- goes to pytest
  python -m te_conformance run --update-baseline        run and make this run the baseline
  python -m te_conformance run --update-baseline --accept-loss "TE 2.21 drops fp8 on CPU"
                                                 ... though it lost coverage (recorded in it)
  python -m te_conformance run --impl transformer_engine gate an installed Transformer Engine
  python -m te_conformance compare new.json reports/baseline/h100.json
  python -m te_conformance merge s1.json s2.json s3.json -o merged.json
  python -m te_conformance rename reports/baseline/cpu.json test_x::test_old test_x::test_new
                                                 carry a renamed test's baseline cases over
  python -m te_conformance render reports/latest/report.json
  python -m te_conformance screenshot reports/latest/report.json -o docs/report_h100.png
  python -m te_conformance matrix runs/*/report.json --out reports/matrix
                                                 the conformance matrix of several adapters' runs

exit codes: 0 pass (or no baseline yet and nothing failed); 1 failing cases, regressions
            against the baseline, or a refused baseline update; 2 corrupt baseline,
            unreadable report or a run stopped early; other: pytest's own exit code.
            matrix: 0 when drawn (whatever its cells say), 2 on bad input.

The tool's own tests (tests/) are not part of the verdict: run them with `pytest -n auto tests`.
"""


def _accept_loss_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--accept-loss",
        metavar="REASON",
        help="with --update-baseline: accept lost coverage (any outcome -> skipped, missing "
        "cases, fewer tensors compared) "
        "into the baseline, which records REASON; without it such an update is refused",
    )


def _float_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ratio-factor",
        type=float,
        default=DEFAULT_FACTOR,
        metavar="F",
        help="a passing case regresses when its worst ratio grows more than F "
        f"times (default {DEFAULT_FACTOR})",
    )
    p.add_argument(
        "--min-ratio",
        type=float,
        default=DEFAULT_MIN_RATIO,
        metavar="X",
        help="ignore ratio changes while the ratio stays below X, where they are "
        f"noise (default {DEFAULT_MIN_RATIO})",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser with its four subcommands."""
    parser = argparse.ArgumentParser(
        prog="python -m te_conformance",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
        description="Run the conformance suites, write report.json/.md/.html, and gate a "
        "release on a baseline of the same machine class.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        allow_abbrev=False,
        help="run pytest, render the report, compare with the baseline",
        description="Run pytest (with -n auto unless you pass -n or -p no:xdist) and the report "
        "plugin; unknown arguments and everything after -- go to pytest.",
    )
    run.add_argument(
        "--out",
        default="reports/latest",
        metavar="DIR",
        help="output directory (default: reports/latest)",
    )
    run.add_argument(
        "--baseline",
        metavar="PATH",
        help="baseline file, or a report (default: reports/baseline/<machine class>.json, or "
        f"<machine class>.<NAME>.json with --impl NAME other than {DEFAULT_IMPL})",
    )
    run.add_argument(
        "--impl",
        action="append",
        metavar="NAME",
        help="gate this adapter (repeatable): a registered name, an installed adapter's entry "
        "point name (te_conformance.adapters) or package.module:Class; passed to pytest, where "
        "it selects the tests that take an adapter (the conformance suites), and compares with "
        "the adapter's own baseline",
    )
    run.add_argument(
        "--machine-class",
        metavar="NAME",
        help="machine class (default: 'cpu' or the first GPU, e.g. 'h100')",
    )
    run.add_argument(
        "--update-baseline",
        action="store_true",
        help="write this run's report as the baseline afterwards",
    )
    run.add_argument(
        "--force",
        action="store_true",
        help="with --update-baseline: update even though cases failed",
    )
    _accept_loss_opt(run)
    run.add_argument(
        "--no-compare",
        action="store_true",
        help="do not compare with a baseline (the gate is the test outcomes alone)",
    )
    _float_opts(run)
    run.set_defaults(func=cmd_run)

    cmp = sub.add_parser(
        "compare",
        allow_abbrev=False,
        help="compare a report with a baseline",
        description="Exit 0 without regressions, 1 with, 2 on unreadable input.",
    )
    cmp.add_argument("new", metavar="NEW", help="the new report.json")
    cmp.add_argument("baseline", metavar="BASELINE", help="the baseline report")
    _float_opts(cmp)
    cmp.add_argument(
        "--update-baseline",
        action="store_true",
        help="after comparing, copy NEW over BASELINE (accepting its changes)",
    )
    cmp.add_argument(
        "--force",
        action="store_true",
        help="with --update-baseline: update even though NEW has failing cases",
    )
    _accept_loss_opt(cmp)
    cmp.set_defaults(func=cmd_compare)

    mrg = sub.add_parser(
        "merge",
        allow_abbrev=False,
        help="merge shard reports into one",
        description="Union of the cases of shard reports (from --te-shard i/n): every shard of "
        "the split, each once; a missing, repeated or overlapping shard is an error (exit 2).",
    )
    mrg.add_argument("reports", nargs="+", metavar="REPORT", help="shard report.json files")
    mrg.add_argument("-o", "--output", required=True, metavar="PATH", help="merged report")
    mrg.set_defaults(func=cmd_merge)

    rnd = sub.add_parser(
        "render",
        allow_abbrev=False,
        help="write report.md and report.html",
        description="Render a report.json as report.md and report.html.",
    )
    rnd.add_argument("report", metavar="REPORT", help="a report.json")
    rnd.add_argument("--out", metavar="DIR", help="output directory (default: the report's)")
    rnd.set_defaults(func=cmd_render)

    shot = sub.add_parser(
        "screenshot",
        allow_abbrev=False,
        help="render report.html, check it in headless Chromium, save a screenshot",
        description="Render a report.json as report.html, load it in headless Chromium (Debian's "
        "chromium package, or $TE_CHROMIUM), check what a reader sees (no console errors, every "
        "plot decoded, the verdict banner and any failure section visible, nothing fetched from "
        "outside the file) and write a PNG screenshot. Exit 1 when a check fails, 2 without "
        "Chromium.",
    )
    shot.add_argument("report", metavar="REPORT", help="a report.json")
    shot.add_argument("-o", "--output", required=True, metavar="PNG", help="the screenshot")
    shot.add_argument("--width", type=int, default=1280, help="viewport width (default 1280)")
    shot.add_argument("--height", type=int, default=1600, help="viewport height (default 1600)")
    shot.add_argument(
        "--full-page", action="store_true", help="the whole page, not the first viewport"
    )
    shot.set_defaults(func=cmd_screenshot)

    ren = sub.add_parser(
        "rename",
        allow_abbrev=False,
        help="carry a renamed or moved test's baseline cases over to its new case key",
        description="Record in BASELINE that the case key OLD is now NEW (case keys: the test "
        "file's stem, then the node id's names and parameters, e.g. "
        "test_x::test_y[bf16-...]). OLD without parameters renames every case of that "
        "test function. Exit 0 when recorded, 2 when BASELINE has no such case.",
    )
    ren.add_argument("baseline", metavar="BASELINE", help="a baseline file")
    ren.add_argument("old", metavar="OLD", help="the old case key (or test_file::test_function)")
    ren.add_argument("new", metavar="NEW", help="the new case key (or test_file::test_function)")
    ren.set_defaults(func=cmd_rename)

    mtx = sub.add_parser(
        "matrix",
        allow_abbrev=False,
        help="draw the conformance matrix: features against implementations",
        description="Read the report.json of one run per implementation (python -m "
        "te_conformance run --impl NAME) and write matrix.md, matrix.html, matrix.png (with "
        "matplotlib) and matrix.json: a row per feature of the catalogue the runs recorded, a "
        "column per implementation "
        "(te_fast, torch.sdpa, flex_attention, transformer_engine, then any other), each cell "
        "conformant, not conformant (failing count, one reproducer), a recorded deviation, not "
        "supported (the most common skip reason) or not run. Exit 0 when drawn, 2 on input that "
        "is not a report or two runs of one implementation.",
    )
    mtx.add_argument("reports", nargs="+", metavar="RUN.json", help="report.json of each run")
    mtx.add_argument(
        "--out", default="reports/matrix", metavar="DIR", help="output directory "
        "(default: reports/matrix)"
    )  # fmt: skip
    mtx.add_argument(
        "--columns",
        metavar="A,B,...",
        help="the implementations to show, in order (default: the four above, then the others)",
    )
    mtx.add_argument(
        "--save-summaries",
        metavar="DIR",
        help="also write a compact copy of each run, DIR/<implementation>.json (the cases and "
        "fields the matrix reads), and draw the matrix from those copies (docs/matrix_runs/)",
    )
    mtx.set_defaults(func=cmd_matrix)
    return parser


def _accept_command(new: Path, baseline: Path) -> str:
    return shlex.join(
        ["python", "-m", "te_conformance", "compare", str(new), str(baseline), "--update-baseline"]
    )


def _update_baseline(
    report: dict, baseline: Path, args: argparse.Namespace, old: dict | None
) -> tuple[bool, list[str]]:
    """Write report as the baseline unless a gate refuses: (updated, the gates overridden).

    Coverage lost against the old baseline (passed -> skipped, cases missing, whatever this run's
    scope: a subset run would drop the rest) is refused without --accept-loss REASON, which the
    new baseline records under "accepted_loss"."""
    force, accept = args.force, (args.accept_loss or "").strip()
    overrides = []
    if interrupted(report):
        if not force:
            print(
                f"refusing to update the baseline {baseline}: the run was stopped early "
                f"({interrupted(report)}) and its report is partial (pass --force to record it "
                "anyway)"
            )
            return False, []
        overrides.append(f"--force: a partial report ({interrupted(report)}) made the baseline")
    failing = len(failures(report))
    if failing:
        if not force:
            print(
                f"refusing to update the baseline {baseline}: {failing} case(s) failed "
                "(fix them, or pass --force to record them as the baseline)"
            )
            return False, []
        overrides.append(f"--force: {failing} failing case(s) recorded in the baseline")
    loss = compare(report, old, scope=WHOLE).coverage_loss if old else []
    accepted = None
    if loss:
        if not accept:
            print(
                f"refusing to update the baseline {baseline}: this run lost coverage of "
                f"{len(loss)} baseline case(s) (passed -> skipped, or missing):"
            )
            for nodeid, detail in loss[:20]:
                print(f"  {nodeid}  {detail}")
            if len(loss) > 20:
                print(f"  ... and {len(loss) - 20} more")
            print('  (pass --accept-loss "REASON" to accept the loss; the baseline records REASON)')
            return False, []
        accepted = {
            "reason": accept,
            "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "cases": [f"{nodeid}: {detail}" for nodeid, detail in loss],
        }
        overrides.append(f"--accept-loss: {len(loss)} case(s) of lost coverage accepted: {accept}")
    made = reports_baseline.from_report(report, accepted)
    reports_baseline.write(made, baseline)
    print(f"baseline updated: {baseline} ({len(made.entries)} cases, fingerprint "
          f"{fingerprint_text(made.fingerprint)})")  # fmt: skip
    return True, overrides


def _workers_chosen(args: list[str]) -> bool:
    """Whether the pytest arguments already say how to use xdist."""
    for i, a in enumerate(args):
        if a in ("-n", "--numprocesses") or a.startswith("--numprocesses="):
            return True
        if a.startswith("-n") and not a.startswith("--"):
            return True
        if a == "-pno:xdist" or (a == "-p" and args[i + 1 : i + 2] == ["no:xdist"]):
            return True
    return False


def _compare_with_baseline(
    report: dict, report_path: Path, baseline: Path, args: argparse.Namespace
) -> tuple[Comparison | None, dict | None, str | None, str]:
    """(the comparison, the baseline, None, "ok") or (None, None, why there is none and what to
    do about it, "skipped" | "missing" | "unusable")."""
    if args.no_compare:
        return None, None, "comparison skipped (--no-compare)", "skipped"
    if not baseline.exists():
        if args.update_baseline:
            return None, None, f"no baseline at {baseline} yet: this run becomes it", "missing"
        return (
            None,
            None,
            (
                f"no baseline at {baseline}; to accept this run as the baseline:\n"
                f"  {_accept_command(report_path, baseline)}\n"
                f"  (or: python -m te_conformance run --baseline {baseline} --update-baseline ...)"
            ),
            "missing",
        )
    try:
        base = reports_baseline.load(baseline)
    except ReportError as e:
        return None, None, f"error: unusable baseline: {e}", "unusable"
    return compare(report, base, args.ratio_factor, args.min_ratio), base, None, "ok"


def _paths_given(args: list[str]) -> bool:
    """Whether the pytest arguments name a test file or directory (pytest's own selection)."""
    return any(not a.startswith("-") and Path(a.split("::")[0]).exists() for a in args)


def _run_pytest(cmd: list[str]) -> int:
    """Run pytest and wait for it whatever signal comes, so that its report is rendered and gated.
    SIGTERM (a CI job's time limit, `timeout`) is passed on: reports.plugin turns it into a Ctrl-C,
    and pytest writes the cases that finished as a partial report. SIGINT is not: a terminal's
    Ctrl-C reaches pytest by itself (pytest's own second Ctrl-C still stops it at once)."""
    proc = subprocess.Popen(cmd)

    def on_signal(signum, frame):
        print(
            f"\nreports: {signal.Signals(signum).name}: waiting for pytest to write the report of "
            "the cases that finished",
            file=sys.stderr,
            flush=True,
        )
        if signum == signal.SIGTERM:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _suite_args(paths: tuple[str, ...]) -> list[str]:
    """The default scope as pytest arguments: the checkout's paths where the run starts in one,
    else the installed suites package's files, with the folder holding it as rootdir so that
    node ids read as in the checkout (suites/conformance/test_x.py::...)."""
    if all(Path(p.partition("::")[0]).exists() for p in paths):
        return list(paths)
    spec = importlib.util.find_spec("te_conformance.suites")
    if spec is None or not spec.submodule_search_locations:
        return list(paths)
    parent = Path(next(iter(spec.submodule_search_locations))).parent
    return ["--rootdir", str(parent), *(str(parent / p) for p in paths)]


def cmd_run(args: argparse.Namespace, pytest_args: list[str]) -> int:
    """Run pytest with the plugin, render, compare with the baseline, print the verdict."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = args.machine_class or env.machine_class()
    impls = args.impl or []
    # another adapter's run has other cases: it is compared with its own baseline (an --impl
    # package.module:Class spec names its baseline with '.' for ':'); the default adapter's cases
    # are the default run's (model.DEFAULT_IMPL), so --impl te_fast shares its baseline
    named = [] if impls == [DEFAULT_IMPL] else impls
    name = ".".join([machine, *(n.replace(":", ".") for n in named)])
    baseline = Path(args.baseline) if args.baseline else BASELINE_DIR / f"{name}.json"
    # without paths, the default scope: the suites (with --impl, the suites' plugin keeps the
    # tests that take an adapter), never tests/ (the tool's own tests, `pytest -n auto tests`)
    default = [] if _paths_given(pytest_args) else list(DEFAULT_SCOPE)
    if default:  # the checkout's paths, or the installed suites' (see _suite_args)
        pytest_args = [*pytest_args, "--te-default-paths", *_suite_args(tuple(default))]
    if impls:
        pytest_args = [*(a for n in impls for a in ("--impl", n)), *pytest_args]
    report_path, junit = out / "report.json", out / "junit.xml"
    report_path.unlink(missing_ok=True)  # a stale report must not stand in for this run's

    cmd = [sys.executable, "-m", "pytest", "-p", "te_conformance.reports.plugin"]
    if not _workers_chosen(pytest_args) and importlib.util.find_spec("xdist"):
        cmd += ["-n", "auto"]
    cmd += [
        "--te-report",
        str(report_path),
        "--junitxml",
        str(junit),
        "--te-machine-class",
        machine,
        *pytest_args,
    ]
    print("+ " + shlex.join(cmd), flush=True)
    rc = _run_pytest(cmd)
    if not report_path.exists():
        print(f"error: pytest exited with code {rc} without writing {report_path}", file=sys.stderr)
        return rc or 2
    report = load_report(report_path)
    stopped = interrupted(report)
    scope = run_scope(report)
    print(f"\nrun: {scope.describe()}")

    result, old, base_problem, base_state = _compare_with_baseline(
        report, report_path, baseline, args
    )
    if result and stopped and result.items["missing"]:
        # the cases that never ran are the stop's doing, said once in the verdict, not regressions
        print(f"{len(result.items['missing'])} baseline case(s) did not run (stopped early)")
        result.items["missing"] = []
    text = format_comparison(result, str(report_path), str(baseline)) if result else base_problem

    print()
    if result:
        print(text)
        if result.news and not args.update_baseline and not failures(report):
            print(
                f"to accept this run as the new baseline:\n  "
                f"{_accept_command(report_path, baseline)}"
            )
    updated, overrides = (
        _update_baseline(report, baseline, args, old) if args.update_baseline else (False, [])
    )
    if args.no_compare:
        overrides.insert(0, "--no-compare: not compared with a baseline")

    verdict = Verdict(
        failing=len(failures(report)),
        passing=report["summary"].get("passed", 0),
        skipped=report["summary"].get("skipped", 0),
        pytest_exit=rc,
        interrupted=stopped or "",
        reported=len(report["cases"]),
        collected=report["summary"].get("collected"),
        regressions=result.regressions if result and not updated else 0,
        baseline=str(baseline),
        baseline_refused=args.update_baseline and not updated,
        no_baseline=base_state == "missing" and not updated,
        unusable_baseline=base_state == "unusable" and not updated,
        run_kind=scope.kind,
        overrides=tuple(overrides),
    )
    report["verdict"] = verdict.as_dict()
    write_report(report, report_path)  # report.json holds the verdict
    md, page = render(report, out, text)

    print("\n" + "=" * 30 + " TE conformance verdict " + "=" * 30)
    print(verdict.status)
    print(f"  {summary_line(report)}")
    by_adapter = adapter_counts(report)
    if any(name != "not an adapter's" for name, _ in by_adapter):
        for name, counts in by_adapter:
            version = (report["environment"].get("impl_versions") or {}).get(name)
            label = f"{name} ({version})" if version else name
            print(f"  {label}: {outcome_counts(counts)}")
    print(f"  {scope.describe()}")
    for reason in verdict.reasons:
        print(f"  - {reason}")
    for note in verdict.notes:
        print(f"  * {note}")
    for adapter, source, tensors, reason, _, outcomes, where in expected_rows(report):
        if source == "declared":
            print(f"  * declared difference of {adapter} ({tensors}; {outcomes}): {reason[:160]}"
                  f" [{where}]")  # fmt: skip
    messages = {c["nodeid"]: (c.get("message") or "").strip() for c in failures(report)}
    for name, (title, gate) in CATEGORIES.items() if verdict.regressions else ():
        for nodeid, detail in result.items[name][:10] if gate else ():
            why = messages.get(nodeid, "").split("\n", 1)[0][:200]
            tail = f": {why}" if why else ""
            print(f"  REGRESSED ({title.split(' (')[0]}) {nodeid}: {detail}{tail}")
    if base_problem and not updated:
        print(base_problem)
    for label, path in (("report", md), ("html", page), ("junit", junit), ("json", report_path)):
        print(f"{label + ':':8}{path}")
    return verdict.exit_code


def cmd_compare(args: argparse.Namespace, _: list[str]) -> int:
    """Compare NEW with BASELINE; optionally make NEW the baseline."""
    new = load_report(args.new)
    baseline = Path(args.baseline)
    if args.update_baseline and not baseline.exists():
        return 0 if _update_baseline(new, baseline, args, None)[0] else 1
    old = reports_baseline.load(baseline)
    result = compare(new, old, args.ratio_factor, args.min_ratio)
    print(format_comparison(result, args.new, args.baseline))
    if args.update_baseline:
        updated, overrides = _update_baseline(new, baseline, args, old)
        for override in overrides:
            print(f"overridden: {override}")
        return 0 if updated else 1
    if result.news and not failures(new):
        print(f"to accept NEW as the baseline:\n  {_accept_command(Path(args.new), baseline)}")
    return 1 if result.regressions else 0


def cmd_rename(args: argparse.Namespace, _: list[str]) -> int:
    """Record a rename in a baseline's rename map."""
    moved = reports_baseline.add_rename(args.baseline, args.old, args.new)
    print(f"{args.baseline}: {args.old} -> {args.new} ({moved} case(s) carried over)")
    return 0


def cmd_merge(args: argparse.Namespace, _: list[str]) -> int:
    """Merge shard reports into one."""
    merged = merge_reports([(path, load_report(path)) for path in args.reports])
    for warning in inconsistencies(merged):
        print(f"warning: {warning}", file=sys.stderr)
    write_report(merged, args.output)
    print(f"{args.output}: {summary_line(merged)}")
    return 0


def cmd_render(args: argparse.Namespace, _: list[str]) -> int:
    """Render report.md and report.html."""
    report = load_report(args.report)
    md, page = render(report, args.out or Path(args.report).parent)
    print(f"{md}\n{page}")
    return 0


def cmd_screenshot(args: argparse.Namespace, _: list[str]) -> int:
    """Render, check in Chromium, write the screenshot."""
    import tempfile

    from te_conformance.reports.browser import BrowserError, check_page, tag_png

    report = load_report(args.report)
    with tempfile.TemporaryDirectory(prefix="te-report-") as tmp:
        _, page = render(report, tmp)
        try:
            result = check_page(page, width=args.width, height=args.height,
                                full_page=args.full_page)  # fmt: skip
        except BrowserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    problems = result.problems(expect_failures=bool(failures(report)))
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if problems:
        print(f"{args.report}: the page has {len(problems)} problem(s); no screenshot written")
        return 1
    # the PNG says which report it shows (tests/test_report_browser.py checks the README's)
    info = {"report": args.report, "summary": summary_line(report),
            "date_utc": report["environment"].get("date_utc")}  # fmt: skip
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_bytes(tag_png(result.screenshot, info))
    print(f"{args.output}: {summary_line(report)}")
    return 0


def cmd_matrix(args: argparse.Namespace, _: list[str]) -> int:
    """Write the conformance matrix of several runs."""
    from te_conformance.reports import matrix as mx

    runs = mx.load_runs(args.reports)
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    drawn = mx.build_matrix(runs, columns)  # raises on two runs of one implementation
    if args.save_summaries:
        out = Path(args.save_summaries)
        compact = []
        for source, report in runs:
            summary = mx.summarize_run(report, source)
            name = "+".join(summary["environment"]["impls"])
            path = out / (re.sub(r"[^\w.+-]", "_", name) + ".json")
            mx.write_summary(summary, path)
            compact.append((str(path), mx.load_report(path)))
            print(f"{path}: {len(summary['cases'])} cases of {source}")
        from_copies = mx.build_matrix(compact, columns)
        if from_copies != drawn:  # summarize_run lost something the matrix reads
            raise ReportError("the compact copies give another matrix than the runs (a bug)")
        drawn = from_copies
    written = mx.write(drawn, Path(args.out))
    for path in written:
        print(path)
    if not any(p.name == "matrix.png" for p in written):
        stale = Path(args.out) / "matrix.png"
        print(
            "matrix.png skipped: matplotlib is not installed (pip install matplotlib)"
            + (f"; {stale} is an earlier one, left as it was" if stale.exists() else "")
        )
    for name in drawn["columns"]:
        states = Counter(row["cells"][name]["state"] for row in drawn["rows"])
        print(f"  {name}: " + ", ".join(
            f"{n} {mx.STATES[s][0]}" for s, n in states.items()
        ))  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # split before argparse, which would otherwise eat or reorder it
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1 :]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command != "run" and (unknown or passthrough):
        parser.error(f"unrecognized arguments: {' '.join(unknown + passthrough)}")
    try:
        return args.func(args, unknown + passthrough)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
