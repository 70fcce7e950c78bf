"""pytest plugin: per-test conformance records, deterministic sharding, the JSON report."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from te_conformance.reports import env, record
from te_conformance.reports.model import build_report, case_key, write_report

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
        help="(set by `python -m te_conformance run`) the paths are its default scope: without "
        "-k/-m/--deselect this is a full run, whose missing baseline cases count",
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


def in_shard(key: str, i: int, n: int) -> bool:
    """Whether the case of this key (case_key) belongs to shard i of n (stable across processes,
    machines and rootdirs)."""
    return zlib.crc32(key.encode()) % n == i - 1


def selection_tags(item) -> dict:
    """What -k and -m see of an item, as data: ``marks`` (the names -m matches) and
    ``keywords`` (the names -k matches, less the item's own name and parameter id, which its
    key holds), so that a later run's -k/-m can be applied to a baseline that holds this case
    (reports.model.Scope). ``keywords`` is None where pytest's matcher could not be read."""
    marks = sorted({m.name for m in item.iter_markers()})
    try:
        from _pytest.mark import KeywordMatcher

        names = set(KeywordMatcher.from_item(item)._names)
    except Exception:  # another pytest's internals: -k cannot be applied to this case later
        return {"marks": marks, "keywords": None}
    callspec = getattr(item, "callspec", None)
    names -= {item.name, getattr(callspec, "id", None)}
    return {"marks": marks, "keywords": sorted(n for n in names if isinstance(n, str))}


def package_name(folder: Path) -> str | None:
    """The dotted name of the package a folder is (its __init__.py and its parents'), or None:
    how the run's node ids import from elsewhere (reports.render's reproducers)."""
    parts = []
    while (folder / "__init__.py").is_file():
        parts.append(folder.name)
        folder = folder.parent
    return ".".join(reversed(parts)) or None


def adapter_name(item) -> str | None:
    """The name of the adapter an item is parametrized with (its ``adapter`` argument), or None
    for a test that judges no adapter (te_fast's own tests, te_ref's, the checks' self-tests)."""
    params = getattr(getattr(item, "callspec", None), "params", None) or {}
    name = getattr(params.get("adapter"), "name", None)
    return name if isinstance(name, str) else None


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


def _check_keys(config, items) -> None:
    """Two collected tests with one case key would be one baseline entry: a usage error."""
    seen: dict[str, str] = {}
    for item in items:
        other = seen.setdefault(case_key(item.nodeid), item.nodeid)
        if other != item.nodeid:
            raise pytest.UsageError(
                f"{other} and {item.nodeid} have the same case key {case_key(item.nodeid)!r} "
                "(test file stem and test name): rename one of the files or tests"
            )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if config.getoption("te_report") or config.getoption("te_shard"):
        _check_keys(config, items)
    shard = config.getoption("te_shard")
    if shard is None:
        return
    i, n = parse_shard(shard)
    keep = [item for item in items if in_shard(case_key(item.nodeid), i, n)]
    dropped = [item for item in items if not in_shard(case_key(item.nodeid), i, n)]
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
                    "torch_threads": _torch_threads(),
                },
            )
        )
        item.user_properties.append(
            (record.PROPERTY_KEY, {"kind": "item", "adapter": adapter_name(item),
                                   **selection_tags(item)})  # fmt: skip
        )


def _torch_threads() -> int | None:
    """torch's intra-op threads in this process (None where torch is not loaded): they change
    how CPU reductions split, so they belong to the fingerprint (ReportWriter)."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:
        return None


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


class Hooks:
    """The hooks through which a suite plugin tells the report what it judges."""

    @pytest.hookspec(firstresult=True)
    def pytest_te_report_features(self, config) -> list[dict] | None:
        """The feature catalogue, [{"key", "group", "label", "rule"}], that the cases'
        recorded ``features`` refer to (the conformance matrix's rows)."""

    @pytest.hookspec(firstresult=True)
    def pytest_te_report_impls(self, config) -> list[dict] | None:
        """The implementations this run judges, [{"name": ..., "version": ...}] (the version
        from the implementation's package metadata; None when unknown). The suites' plugin
        answers it from the adapters --impl selects; reports/ knows nothing of adapters."""


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(Hooks)


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
        self.threads: set[int] = set()  # torch's threads in the processes that ran tests
        self.defined: dict[str, dict] = {}  # features the cases' tests define (not catalogued)

    def pytest_sessionstart(self, session):
        self.start = time.time()
        self.environment = env.environment(
            self.config.rootpath,
            list(self.config.invocation_params.args),
            self.config.getoption("te_shard"),
            self.config.getoption("te_machine_class"),
        )
        self.environment["selection"] = selection(self.config)
        self.environment["started_in"] = str(self.config.invocation_params.dir)
        self.environment["rootdir"] = str(self.config.rootpath)
        self.environment["rootdir_package"] = package_name(Path(self.config.rootpath))
        try:
            impls = self.config.hook.pytest_te_report_impls(config=self.config)
        except Exception:  # an --impl that does not resolve: collection reports it, and the
            impls = None  # report is written all the same
        if impls is not None:
            # environment.impls: the names (python -m te_conformance matrix puts the run in those
            # columns); impl_versions: what was judged, name -> version
            self.environment["impls"] = [i["name"] for i in impls]
            self.environment["impl_versions"] = {i["name"]: i.get("version") for i in impls}
        catalogue = self.config.hook.pytest_te_report_features(config=self.config)
        if catalogue is not None:  # the rows the cases' recorded features name
            self.environment["features"] = record._plain(catalogue)

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

    def _case(self, nodeid: str, t: dict) -> dict:
        fields: dict = {}
        tensors: list = []
        counters: dict = {}
        environ: dict = {}
        item: dict = {}
        expected: list = []
        features: list = []
        declined_features: list = []  # features asked for, turned away, the rest run
        declared: set = set()  # the test's own (its feature markers), which a case keeps
        skip: dict | None = None
        reproducer = None  # a command that shows the failure on its own, where the test noted one
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
            elif kind == "item":
                item.update(payload)
            elif kind == "expected":
                if payload not in expected:
                    expected.append(payload)
            elif kind == "features":
                for row in payload.get("defines") or []:  # a feature its test defines
                    if isinstance(row, dict) and isinstance(row.get("key"), str):
                        self.defined.setdefault(row["key"], row)
                if payload.get("declared"):
                    declared.update(payload.get("keys") or [])
                if payload.get("replace"):  # the recorded ones before it were another case's
                    features = [k for k in features if k in declared]
                    declined_features = []
                features += [k for k in payload.get("keys") or [] if k not in features]
                declined_features += [d for d in payload.get("declined") or []
                                      if isinstance(d, dict) and d not in declined_features]
            elif kind == "reproducer":
                reproducer = payload.get("command")
            elif kind == "skip":
                skip = {"kind": payload.get("skip_kind"), "reasons": payload.get("reasons") or []}
            elif kind == "counters":
                # Several calls (e.g. forward, then backward) add up.
                for k, v in payload.items():
                    old = counters.get(k, 0)
                    both_num = all(
                        isinstance(x, (int, float)) and not isinstance(x, bool) for x in (old, v)
                    )
                    counters[k] = old + v if both_num else v
        texts = t["texts"]
        if t["outcome"] == "skipped" and skip is None:  # a skip no suite classified
            skip = {"kind": "unrecorded", "reasons": [{"text": t["skip_reason"] or "-",
                                                       "feature": None}]}  # fmt: skip
        if t["outcome"] != "skipped":
            skip = None  # a skip reason recorded by a test that then ran on
        if environ.get("torch_threads") is not None:
            self.threads.add(environ["torch_threads"])
        return record._plain(
            {
                "nodeid": nodeid or "<collection>",
                "key": case_key(nodeid) if nodeid else "<collection>",
                "id": case_id(nodeid),
                "adapter": item.get("adapter"),
                "marks": item.get("marks"),
                "keywords": item.get("keywords"),
                "expected": expected,
                "features": sorted(features),
                "declined_features": declined_features,
                "skip": skip,
                "reproducer": reproducer,
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
        if self.defined:  # rows the cases define, after the catalogue's
            known = {f.get("key") for f in self.environment.setdefault("features", [])}
            self.environment["features"] += [
                record._plain(row) for key, row in self.defined.items() if key not in known
            ]
        fingerprint = self.environment.get("fingerprint")
        if isinstance(fingerprint, dict):  # the threads the tests ran with: one count, or all
            threads = sorted(self.threads)
            fingerprint["torch_threads"] = threads[0] if len(threads) == 1 else threads or None
        report = build_report(
            cases,
            self.environment,
            round(time.time() - self.start, 3),
            interrupted=stopped,
            collected=session.testscollected if stopped else None,
        )
        write_report(report, self.path)
