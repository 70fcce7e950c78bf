"""pytest plugin: per-test conformance records, deterministic sharding, the JSON report."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import zlib
from pathlib import Path

import pytest

from reports import env, record
from reports.model import build_report, write_report

MAX_LONGREPR = 4000


def pytest_addoption(parser):
    group = parser.getgroup("te-conformance", "conformance report (reports.plugin)")
    group.addoption(
        "--te-report",
        metavar="PATH",
        default=None,
        help="write the JSON conformance report to PATH at session end",
    )
    group.addoption(
        "--te-shard",
        metavar="i/n",
        default=None,
        help="run only shard i of n (1-based); shards 1..n together run every test exactly once",
    )
    group.addoption(
        "--te-default-paths",
        action="store_true",
        default=False,
        help="(set by `python -m reports run`) the paths are its default scope: without -k/-m/"
        "--deselect this is a full run, whose missing baseline cases count",
    )
    group.addoption(
        "--te-machine-class",
        metavar="NAME",
        default=None,
        help="machine class recorded in the report (default: detected with nvidia-smi)",
    )


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' -> (i, n), or a UsageError saying what a valid shard looks like."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise pytest.UsageError(
            f"--te-shard={text!r}: expected i/n with 1 <= i <= n (1-based), e.g. --te-shard=2/4"
        )
    return int(m[1]), int(m[2])


def in_shard(nodeid: str, i: int, n: int) -> bool:
    """Whether nodeid belongs to shard i of n (stable across processes and machines)."""
    return zlib.crc32(nodeid.encode()) % n == i - 1


_stopped_by: list[str] = []  # the signal that ended this process's session early, if one did
_previous_sigterm: list = []  # the SIGTERM handler _stop_on_sigterm replaced


def _stop_on_sigterm(signum, frame):
    """SIGTERM as a Ctrl-C. A CI job's time limit (or `timeout`) sends SIGTERM, whose default kills
    the process on the spot: no report, and the finished cases are lost. As KeyboardInterrupt it
    ends the session the way Ctrl-C does, in xdist's controller and workers alike, and the
    controller writes the cases that finished, marked partial. Later SIGTERMs are ignored so that
    the report gets written (SIGKILL still stops everything)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    name = signal.Signals(signum).name
    _stopped_by.append(name)
    raise KeyboardInterrupt(f"stopped by {name}")


def pytest_configure(config):
    shard = config.getoption("te_shard")
    if shard is not None:
        parse_shard(shard)
    path = config.getoption("te_report")
    # Only with a report to write, only where nobody else handles SIGTERM (signal handlers live in
    # the main thread); xdist hands the option to its workers too.
    if (
        path
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        _previous_sigterm.append(signal.signal(signal.SIGTERM, _stop_on_sigterm))
    # Under xdist only the controller writes: it sees every worker's reports.
    if path and not hasattr(config, "workerinput"):
        path = Path(config.invocation_params.dir, path)
        config.pluginmanager.register(ReportWriter(config, path), "te-conformance-writer")


def pytest_unconfigure(config):
    ours = (_stop_on_sigterm, signal.SIG_IGN) if _stopped_by else (_stop_on_sigterm,)
    if _previous_sigterm and signal.getsignal(signal.SIGTERM) in ours:
        signal.signal(signal.SIGTERM, _previous_sigterm.pop())
    _stopped_by.clear()  # a later session in this process (pytester) starts unstopped


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    shard = config.getoption("te_shard")
    if shard is None:
        return
    i, n = parse_shard(shard)
    keep = [item for item in items if in_shard(item.nodeid, i, n)]
    dropped = [item for item in items if not in_shard(item.nodeid, i, n)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_report_header(config):
    lines = []
    if config.getoption("te_shard"):
        lines.append(f"te-shard: {config.getoption('te_shard')}")
    if config.getoption("te_report"):
        lines.append(f"te-report: {config.getoption('te_report')}")
    return lines


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    record.set_current_item(item)
    try:
        return (yield)
    finally:
        record.set_current_item(None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    try:
        return (yield)
    finally:
        # After the fixtures: a session fixture may be what pins this worker to its GPU.
        item.user_properties.append(
            (
                record.PROPERTY_KEY,
                {
                    "kind": "env",
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                },
            )
        )


def selection(config) -> dict:
    """What the run selected: its paths relative to the root directory ('.' for the root), -k, -m,
    --deselect, --lf (reports.model.run_scope tells a full run from a subset with it)."""
    root = Path(config.rootpath).resolve()
    paths = []
    for arg in config.args:
        path, sep, rest = str(arg).partition("::")
        p = Path(config.invocation_params.dir, path).resolve()
        try:
            rel = p.relative_to(root).as_posix()
        except ValueError:
            rel = p.as_posix()
        paths.append(rel + sep + rest)
    option = config.option
    return {
        "paths": paths,
        "keyword": getattr(option, "keyword", "") or None,
        "markexpr": getattr(option, "markexpr", "") or None,
        "deselect": list(getattr(option, "deselect", None) or []),
        "last_failed": bool(getattr(option, "lf", False)),
        "default_paths": bool(config.getoption("te_default_paths")),
    }


def judged_impls(config) -> list[str] | None:
    """The names of the adapters the run judges: the suites' --impl resolved to adapter names
    (`package.module:Class` and entry points name their adapter's `name`), or the suites' default
    selection without --impl; None where the suites' plugin is not loaded. `python -m reports
    matrix` reads it (environment.impls) to put the run in its columns."""
    try:
        specs = config.getoption("impl")
    except ValueError:  # no --impl option: not a run of the suites
        return None
    try:
        from suites.adapters import selected
    except ImportError:
        return list(specs) if specs else None
    try:
        return [adapter.name for adapter in selected(config)]
    except Exception:  # an --impl that does not resolve (or whose import fails): collection
        return list(specs) if specs else None  # reports it; the report is written all the same


def case_id(nodeid: str) -> str:
    """The parametrization id of a nodeid ('...::test_fwd[bf16-causal]' -> 'bf16-causal')."""
    name = nodeid.rsplit("::", 1)[-1]
    m = re.search(r"\[(.*)\]$", name)
    return m.group(1) if m else name


def _phase_outcome(report) -> str | None:
    """What one phase report says about the test (None: nothing, e.g. a passing setup)."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if xfail:
            return "xfailed" if report.skipped else "xpassed" if report.passed else "failed"
        return report.outcome
    if report.when in ("setup", "teardown", "collect"):
        if report.failed:
            return "error"
        if report.skipped:
            return "xfailed" if xfail else "skipped"
        return None
    return "failed"  # xdist's report for the test its worker crashed on (when == "???")


_RANK = {None: 0, "passed": 1, "skipped": 2, "xfailed": 2, "xpassed": 2, "failed": 3, "error": 4}


def _crash_message(report, text: str) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if getattr(crash, "message", None):
        return crash.message
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errors = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (errors or lines or [""])[-1 if errors else 0].strip()


def truncate(text: str, limit: int = MAX_LONGREPR) -> str:
    """Keep the head and (mostly) the tail, where the assertion message is."""
    if len(text) <= limit:
        return text
    head, tail = limit // 4, limit - limit // 4
    return f"{text[:head]}\n... [{len(text) - limit} chars truncated] ...\n{text[-tail:]}"


class ReportWriter:
    """Collects phase reports on the controller and writes the JSON report at session end."""

    def __init__(self, config, path: Path):
        self.config, self.path = config, path
        self.tests: dict[str, dict] = {}
        self.start = time.time()
        self.environment: dict = {}

    def pytest_sessionstart(self, session):
        self.start = time.time()
        self.environment = env.environment(
            self.config.rootpath,
            list(self.config.invocation_params.args),
            self.config.getoption("te_shard"),
            self.config.getoption("te_machine_class"),
        )
        self.environment["selection"] = selection(self.config)
        impls = judged_impls(self.config)
        if impls is not None:
            self.environment["impls"] = impls

    def _add(self, report) -> None:
        t = self.tests.setdefault(
            report.nodeid,
            {
                "outcome": None,
                "duration": 0.0,
                "texts": [],
                "message": None,
                "skip_reason": None,
                "props": [],
                "worker": None,
            },
        )
        outcome = _phase_outcome(report)
        if _RANK[outcome] > _RANK[t["outcome"]]:
            t["outcome"] = outcome
        t["duration"] += getattr(report, "duration", 0.0) or 0.0
        # user_properties only grow during a test, so the longest list holds everything.
        props = list(getattr(report, "user_properties", None) or [])
        if len(props) >= len(t["props"]):
            t["props"] = props
        gateway = getattr(getattr(report, "node", None), "gateway", None)
        t["worker"] = getattr(gateway, "id", None) or t["worker"]
        if report.failed:
            text = report.longreprtext
            if gateway is not None and text.startswith(f"[{gateway.id}] "):
                text = text.partition("\n")[2]  # xdist's "[gw0] linux -- Python ..." line
            text = text.strip("\n")
            t["message"] = t["message"] or _crash_message(report, text)
            t["texts"].append(f"[{report.when}] {text}" if t["texts"] else text)
        elif report.skipped:
            if hasattr(report, "wasxfail"):
                t["skip_reason"] = report.wasxfail or "xfail"
            elif isinstance(report.longrepr, (tuple, list)) and len(report.longrepr) == 3:
                t["skip_reason"] = str(report.longrepr[2]).removeprefix("Skipped: ")

    def pytest_runtest_logreport(self, report):
        self._add(report)

    def pytest_collectreport(self, report):
        # A module that fails to import (or skips itself) has no test reports: record it so
        # the lost cases are visible instead of silently absent.
        if report.failed or report.skipped:
            self._add(report)

    @staticmethod
    def _case(nodeid: str, t: dict) -> dict:
        fields: dict = {}
        tensors: list = []
        counters: dict = {}
        environ: dict = {}
        for entry in t["props"]:
            if len(entry) != 2 or entry[0] != record.PROPERTY_KEY or not isinstance(entry[1], dict):
                continue
            payload = {k: v for k, v in entry[1].items() if k != "kind"}
            kind = entry[1].get("kind")
            if kind == "case":
                fields.update(payload)
            elif kind == "tensor":
                tensors.append(payload)
            elif kind == "env":
                environ.update(payload)
            elif kind == "counters":
                # Several calls (e.g. forward, then backward) add up.
                for k, v in payload.items():
                    old = counters.get(k, 0)
                    both_num = all(
                        isinstance(x, (int, float)) and not isinstance(x, bool) for x in (old, v)
                    )
                    counters[k] = old + v if both_num else v
        texts = t["texts"]
        return record._plain(
            {
                "nodeid": nodeid or "<collection>",
                "id": case_id(nodeid),
                "outcome": t["outcome"] or "error",
                "fields": fields,
                "tensors": tensors,
                "counters": counters,
                "duration_s": round(t["duration"], 4),
                "message": t["message"],
                "longrepr": truncate("\n".join(texts)) if texts else None,
                "skip_reason": t["skip_reason"],
                "worker": t["worker"] or environ.get("worker"),
                "cuda_visible_devices": environ.get("cuda_visible_devices"),
            }
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        stopped = None
        if _stopped_by:
            stopped = _stopped_by[0]
        elif exitstatus == pytest.ExitCode.INTERRUPTED:
            stopped = "KeyboardInterrupt"
        # A test the stop caught between its setup and its result has no outcome: it did not
        # finish, like those that never started (otherwise no outcome is an error: _case).
        cases = [
            self._case(nodeid, t)
            for nodeid, t in self.tests.items()
            if t["outcome"] is not None or not stopped
        ]
        report = build_report(
            cases,
            self.environment,
            round(time.time() - self.start, 3),
            interrupted=stopped,
            collected=session.testscollected if stopped else None,
        )
        write_report(report, self.path)
