"""Mutation harness: plant each catalogued defect in a scratch copy and see whether the suites fail.

    python -m tools.mutation [--list] [--only NAME[,NAME]] [--device cpu|cuda|all] [-j N]
                              [--xdist N] [--out DIR] [--scratch DIR] [--keep]

For every defect of tools/mutation/catalogue.py, in a scratch copy of the working tree (one per
parallel job): apply the text replacement, rebuild te_fast._C when the defect is in C++/CUDA
source (the copy's ninja build is incremental; a Python defect reuses the unmutated extension),
run the defect's own suite files first with ``pytest -x``, and when they pass, the device's whole
suite set (SUITES), so that a survivor is one the suites really miss. A defect is

- CAUGHT: a test failed (the first failing test id is recorded). At the end each killing test is
  re-run on the unmutated copy and must pass there; one that fails there too makes it an ERROR.
- SURVIVED: the whole suite set passed with the defect in place.
- ERROR: its old text no longer matches exactly once, a Python defect does not compile or reads
  a name the code lacks (a NameError would fail every test), its build or load failed, pytest
  could not run, a run timed out, or the killing test fails without the defect. A failure.
- NOT RUN: a CUDA defect on a machine without a CUDA device (never counted as caught).

The kill matrix goes to <out>/mutation.json and <out>/mutation.md (default reports/latest; the
report renderer adds it to report.md/html when it sits next to report.json), per-defect logs to
<out>/mutation_logs/. Exit status: 0 when every defect that ran was caught or is a known gap of
the catalogue; 1 on an error or an unlisted survivor; 2 when nothing could run.
"""

from __future__ import annotations

import argparse
import builtins
import datetime
import importlib.util
import json
import os
import platform
import queue
import re
import shlex
import shutil
import subprocess
import symtable
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.mutation.catalogue import DEFECTS, DEVICES, KNOWN_GAPS, SUITES, Defect, SuiteSet

ROOT = Path(__file__).resolve().parents[2]
CAUGHT, SURVIVED, ERROR, NOT_RUN = "CAUGHT", "SURVIVED", "ERROR", "NOT RUN"
RESULTS = (CAUGHT, SURVIVED, ERROR, NOT_RUN)
FIRST, FULL = "first", "full"  # the defect's own suite files; the device's whole suite set

# Never copied into a scratch tree: VCS data, environments, build products, caches, outputs.
_SKIP_NAMES = frozenset({
    ".git", ".venv", ".ci-venv", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache",
    ".ruff_cache", "gpu_out", ".device_out", ".whl",
})  # fmt: skip
_SKIP_PATHS = frozenset({"reports/latest"})

BUILD_TIMEOUT_S = 1800
FIRST_TIMEOUT_S = 900
FULL_TIMEOUT_S = 3600

_LOAD_CHECK = """
import sys, torch, te_fast
from pathlib import Path
root, device, clean = Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3] == "1"
where = Path(te_fast.__file__).resolve()
if root not in where.parents:
    sys.exit(f"te_fast imported from {where}, not from the scratch copy {root}")
reason = te_fast.device_unavailable_reason(device)
if reason:
    sys.exit(reason)
if clean:  # a C++ exception must reach Python (some toolchains turn the throw into a crash)
    try:
        te_fast.ops.scaled_softmax(torch.ones(2, 2, device=device), 1.0)
    except RuntimeError:
        pass
    else:
        sys.exit("an argument error did not raise")
"""


@dataclass(frozen=True)
class Project:
    """What the harness mutates and how it judges a copy: the tree, its suite set per device,
    and whether it has the te_fast._C extension (built in each copy, rebuilt by native defects)."""

    root: Path
    suites: dict[str, SuiteSet] = field(default_factory=lambda: dict(SUITES))
    extension: bool = True


@dataclass
class Outcome:
    """The result of one defect, as the kill matrix records it."""

    name: str
    device: str
    path: str
    description: str
    result: str = NOT_RUN
    test: str | None = None  # CAUGHT: the first failing test id
    stage: str | None = None  # CAUGHT: FIRST or FULL; SURVIVED: FULL
    seconds: float = 0.0
    detail: str = ""
    known_gap: str | None = None
    log: str | None = None
    marker: str | None = None  # the -m expression of the run that caught it (for the re-run)


@dataclass
class PytestRun:
    """One pytest process: its exit code, output and what it says."""

    rc: int | None  # None: timed out
    output: str
    seconds: float

    def first_failure(self) -> str | None:
        """The first FAILED/ERROR test id of the short test summary (a path for a file that
        failed to collect)."""
        ids = summary_ids(self.output, ("FAILED", "ERROR"))
        return ids[0] if ids else None


_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S.*?)(?: - .*)?$")
# the summary's own header line, at the start of a line (a failure message quoting another
# pytest run's output holds such a header too, indented)
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$", re.M)


def summary_ids(output: str, kinds: tuple[str, ...]) -> list[str]:
    """Test ids of the given outcome kinds from pytest's short test summary (-r)."""
    headers = list(_SUMMARY_HEADER.finditer(output))
    start = headers[-1].start() if headers else -1
    ids = []
    for line in output[start if start >= 0 else 0 :].splitlines():
        m = _SUMMARY.match(line)
        if m and m.group(1) in kinds:
            ids.append(m.group(2).split(" ")[0] if m.group(1) == "SKIPPED" else m.group(2))
    return ids


def undefined_names(source: str, filename: str) -> set[str]:
    """Global names that the module's code reads but nothing defines (symtable, no import):
    a Python defect that reads a name the code no longer has would fail every test with a
    NameError, a kill that says nothing about the suites."""
    top = symtable.symtable(source, filename, "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    defined |= set(dir(builtins)) | {"__file__", "__name__", "__doc__"}
    used, scopes = set(), [top]
    while scopes:
        scope = scopes.pop()
        scopes.extend(scope.get_children())
        used |= {
            s.get_name() for s in scope.get_symbols()
            if s.is_referenced() and (scope is top or s.is_global())
        }  # fmt: skip
    return used - defined


def python_defect_problem(original: str, mutated: str, filename: str) -> str | None:
    """Why a Python defect cannot be judged: it does not compile or reads undefined names."""
    try:
        compile(mutated, filename, "exec")
    except SyntaxError as e:
        return f"the defect does not compile: {e}"
    new = undefined_names(mutated, filename) - undefined_names(original, filename)
    if new:
        return f"the defect reads undefined names: {', '.join(sorted(new))}"
    return None


# ----------------------------------------------------------------------------- scratch copies


def _ignore(src_root: Path, avoid: tuple[Path, ...] = ()):
    """copytree's ignore: _SKIP_NAMES, _SKIP_PATHS, and ``avoid`` (the scratch copies and the
    logs, should they lie inside the tree: a copy must not copy itself)."""
    src_root = src_root.resolve()
    avoided = {p.resolve() for p in avoid}

    def ignore(directory: str, names: list[str]) -> set[str]:
        here = Path(directory).resolve()
        rel = here.relative_to(src_root)
        return {
            n for n in names
            if n in _SKIP_NAMES or n.endswith(".egg-info") or (rel / n).as_posix() in _SKIP_PATHS
            or here / n in avoided
        }  # fmt: skip

    return ignore


def extension_fresh(root: Path) -> bool:
    """Whether root's built te_fast._C is newer than every file it is built from."""
    built = list((root / "te_fast").glob("_C*.so"))
    if not built:
        return False
    sources = [root / "setup.py", *(p for p in (root / "csrc").rglob("*") if p.is_file())]
    newest = max((p.stat().st_mtime for p in sources if p.exists()), default=0.0)
    return min(p.stat().st_mtime for p in built) >= newest


def _write(path: Path, text: str) -> None:
    """Write and stamp the file as new: ninja and Python decide staleness by mtime."""
    path.write_text(text)
    os.utime(path, None)


def _child_env(copy: Path, source_root: Path) -> dict[str, str]:
    """The environment of a process in the copy: the copy first on the import path, the source
    tree never (its te_fast would shadow the mutated one), and no bytecode caches (a same-size
    edit within one second would otherwise run a stale .pyc)."""
    env = dict(os.environ)
    keep = [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep)
        if p and Path(p).resolve() != source_root.resolve()
    ]  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *keep])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("TE_FUZZ_EXAMPLES", None)
    return env


class Workspace:
    """One scratch copy of the project. Defects are applied to it one at a time and always
    restored; the extension state says whether te_fast._C matches the unmutated sources."""

    def __init__(self, project: Project, path: Path, log_dir: Path, xdist: int, avoid=()):
        self.project = project
        self.path = path
        self.avoid = (path.parent, log_dir, *avoid)  # never copied into the copy
        self.log_dir = log_dir
        self.xdist = xdist
        self.prepared = False
        self.extension_clean = False  # te_fast._C built from unmutated sources
        self.loads_on: set[str] = set()  # devices the clean extension was checked to run on

    # -------------------------------------------------------------------- processes

    def _run(self, cmd: list[str], log, timeout: float) -> PytestRun:
        start = time.monotonic()
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        # A cache of inductor's own per run: its FX graph and AOT autograd caches key a compiled
        # graph by the graph, not by the Python behind a custom op's registered backward, so a
        # graph compiled under one defect was loaded by the next run on the clean tree (a
        # killing test then "failed without the defect", dq 4x off: the unscaled backward).
        cache = tempfile.mkdtemp(prefix="te-mutation-inductor-")
        env = {**_child_env(self.path, self.project.root), "TORCHINDUCTOR_CACHE_DIR": cache}
        try:
            proc = subprocess.run(
                cmd, cwd=self.path, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
            )  # fmt: skip
            rc, output = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as e:
            rc = None
            output = (e.stdout or b"").decode(errors="replace") if isinstance(
                e.stdout, bytes
            ) else (e.stdout or "")  # fmt: skip
            output += f"\n[harness] timed out after {timeout:.0f} s\n"
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        log.write(output)
        log.flush()
        return PytestRun(rc, output, time.monotonic() - start)

    def pytest(self, paths, marker, log, *, k=None, ignore=(), exitfirst=True, xdist=0,
               extra=(), timeout=FIRST_TIMEOUT_S) -> PytestRun:  # fmt: skip
        """pytest in the copy: quiet, no cache, a short summary of failures and errors."""
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short"]
        cmd += ["-rA"] if not exitfirst else ["-rfE", "-x"]
        if marker:
            cmd += ["-m", marker]
        if k:
            cmd += ["-k", k]
        for path in ignore:
            cmd += ["--ignore", path]
        if xdist > 1:
            cmd += ["-n", str(xdist)]
        return self._run([*cmd, *extra, *paths], log, timeout)

    def build(self, log, device: str, clean: bool) -> str | None:
        """Build te_fast._C in the copy and check that it loads from there (and, for a clean
        build, that an argument error raises). None on success, else what went wrong."""
        run = self._run(
            [sys.executable, "setup.py", "build_ext", "--inplace"], log, BUILD_TIMEOUT_S
        )
        if run.rc != 0:
            tail = run.output.strip().splitlines()[-3:]
            return "build failed: " + " | ".join(tail) if run.rc is not None else "build timed out"
        return self.load_check(log, device, clean)

    def load_check(self, log, device: str, clean: bool) -> str | None:
        run = self._run(
            [sys.executable, "-c", _LOAD_CHECK, str(self.path), device, "1" if clean else "0"],
            log, 300,
        )  # fmt: skip
        if run.rc == 0:
            return None
        return "te_fast._C does not load: " + (run.output.strip().splitlines() or ["?"])[-1]

    # -------------------------------------------------------------------- state

    def prepare(self, log, device: str) -> str | None:
        """Copy the tree (once). The source tree's built extension is reused when it is newer
        than every C++ source; otherwise it is built here."""
        if not self.prepared:
            shutil.copytree(
                self.project.root, self.path, ignore=_ignore(self.project.root, self.avoid)
            )
            self.prepared = True
            # the source tree's build serves when it is newer than every C++ source; the
            # first ensure_clean checks that it loads here (and has the device's kernels)
            self.extension_clean = extension_fresh(self.project.root)
            if not self.extension_clean:
                for so in (self.path / "te_fast").glob("_C*.so"):
                    so.unlink()
        return self.ensure_clean(log, device)

    def ensure_clean(self, log, device: str) -> str | None:
        """Rebuild te_fast._C from the unmutated sources when a native defect was built in (or
        nothing was built yet, or the build lacks the device's kernels)."""
        if not self.project.extension:
            return None
        if self.extension_clean and (
            device in self.loads_on or self.load_check(log, device, clean=True) is None
        ):
            self.loads_on.add(device)
            return None
        problem = self.build(log, device, clean=True)
        self.extension_clean = problem is None
        self.loads_on = {device} if problem is None else set()
        return None if problem is None else f"the unmutated tree: {problem}"

    # -------------------------------------------------------------------- one defect

    def run_defect(self, defect: Defect, suite: SuiteSet) -> Outcome:
        """Apply, build if native, run the defect's suites then the device's set, restore."""
        out = Outcome(defect.name, defect.device, defect.path, defect.description)
        log_path = self.log_dir / f"{defect.name}.log"
        out.log = str(log_path)
        start = time.monotonic()
        with open(log_path, "w") as log:
            log.write(f"defect {defect.name} ({defect.device}): {defect.description}\n")
            log.write(f"in {defect.path}\n--- old\n{defect.old}\n+++ new\n{defect.new}\n")
            try:
                self._judge(defect, suite, out, log)
            except Exception as e:  # the harness itself: report, never pass
                out.result, out.detail = ERROR, f"harness error: {type(e).__name__}: {e}"
            out.seconds = round(time.monotonic() - start, 1)
            log.write(f"\n[harness] {out.result} {out.test or ''} {out.detail}\n")
        return out

    def _judge(self, defect: Defect, suite: SuiteSet, out: Outcome, log) -> None:
        problem = self.prepare(log, defect.device)
        if problem:
            out.result, out.detail = ERROR, problem
            return
        target = self.path / defect.path
        original = target.read_text() if target.exists() else ""
        count = original.count(defect.old)
        if count != 1:
            out.result = ERROR
            out.detail = f"the old text occurs {count} times in {defect.path} (expected once)"
            return
        mutated = original.replace(defect.old, defect.new)
        if not defect.native:
            problem = python_defect_problem(original, mutated, defect.path)
            if problem:
                out.result, out.detail = ERROR, problem
                return
        try:
            _write(target, mutated)
            if defect.native and self.project.extension:
                self.extension_clean, self.loads_on = False, set()
                problem = self.build(log, defect.device, clean=False)
                if problem:
                    out.result, out.detail = ERROR, problem
                    return
            self._stages(defect, suite, out, log)
        finally:
            _write(target, original)

    def _stages(self, defect: Defect, suite: SuiteSet, out: Outcome, log) -> None:
        marker = defect.marker or suite.marker
        first = self.pytest(defect.suites, marker, log, k=defect.k, ignore=suite.ignore)
        if self._settle(first, FIRST, marker, out):
            return
        if first.rc == 5:
            out.result = ERROR
            out.detail = "its first suites select no test (stale suites/k of the catalogue)"
            return
        full = self.pytest(
            suite.paths, suite.marker, log, ignore=suite.ignore, xdist=self.xdist,
            timeout=FULL_TIMEOUT_S,
        )  # fmt: skip
        if self._settle(full, FULL, suite.marker, out):
            return
        if full.rc == 0:
            out.result, out.stage = SURVIVED, FULL
            out.detail = f"the whole {defect.device} suite set passed"
        else:
            out.result, out.detail = ERROR, f"the whole suite set: pytest exit {full.rc}"

    @staticmethod
    def _settle(run: PytestRun, stage: str, marker: str, out: Outcome) -> bool:
        """Record a run that decides the defect (a failing test, a crash, a timeout)."""
        if run.rc is None:
            out.result, out.detail = ERROR, f"{stage} run timed out after {run.seconds:.0f} s"
            return True
        if run.rc < 0:  # the pytest process died (a crash is a failing suite, with no test id)
            out.result, out.stage, out.marker = CAUGHT, stage, marker
            out.test = f"<pytest crashed: signal {-run.rc}>"
            return True
        if run.rc in (1, 2):
            failing = run.first_failure()
            if failing:
                out.result, out.stage, out.test, out.marker = CAUGHT, stage, failing, marker
                return True
            out.result, out.detail = ERROR, f"{stage} run: pytest exit {run.rc} without a failure"
            return True
        if run.rc not in (0, 5):
            out.result, out.detail = ERROR, f"{stage} run: pytest exit {run.rc}"
            return True
        return False

    # -------------------------------------------------------------------- re-running kills

    def verify(self, outcomes: list[Outcome], log) -> None:
        """Re-run every killing test on the unmutated copy: each must pass there, else the kill
        was not the defect's doing and the outcome becomes an ERROR."""
        caught = [o for o in outcomes if o.result == CAUGHT and not o.test.startswith("<")]
        for device in sorted({o.device for o in caught}):
            problem = self.ensure_clean(log, device)
            for marker in sorted({o.marker or "" for o in caught if o.device == device}):
                group = [o for o in caught if o.device == device and (o.marker or "") == marker]
                if problem:
                    for o in group:
                        o.result, o.detail = ERROR, f"not re-run without the defect: {problem}"
                    continue
                self._verify_group(group, marker, log)

    def _verify_group(self, group: list[Outcome], marker: str, log) -> None:
        tests = sorted({o.test for o in group if "::" in o.test})
        files = sorted({o.test for o in group if "::" not in o.test})  # collection errors
        passed: set[str] = set()
        if tests:
            run = self.pytest(tests, marker, log, exitfirst=False, timeout=FULL_TIMEOUT_S)
            passed |= set(summary_ids(run.output, ("PASSED",)))
        for path in files:
            run = self.pytest([path], marker, log, extra=("--collect-only",))
            if run.rc == 0:
                passed.add(path)
        for o in group:
            if o.test not in passed:
                o.result = ERROR
                o.detail = f"the killing test {o.test} does not pass without the defect either"


# ----------------------------------------------------------------------------- the whole run


def cuda_available() -> bool:
    """Whether this machine has a CUDA device (asked without building the extension)."""
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _order(defects: list[Defect]) -> list[Defect]:
    """Python defects first (they share a copy's unmutated extension), native ones after."""
    return sorted(defects, key=lambda d: d.native)


def run_mutations(
    project: Project,
    defects: list[Defect],
    *,
    devices: tuple[str, ...],
    jobs: int = 1,
    xdist: int = 0,
    log_dir: Path,
    scratch: Path | None = None,
    keep: bool = False,
    known_gaps: dict[str, str] | None = None,
    progress=print,
    on_outcome=None,
) -> list[Outcome]:
    """Run every defect whose device is in ``devices`` (the others are NOT RUN), ``jobs`` at a
    time in as many scratch copies, then re-run the killing tests without the defects.
    known_gaps (default: the catalogue's KNOWN_GAPS) marks the survivors the suites may miss;
    on_outcome(outcomes so far) is called after each defect (a partial kill matrix survives a
    run that is stopped)."""
    known_gaps = KNOWN_GAPS if known_gaps is None else known_gaps
    log_dir.mkdir(parents=True, exist_ok=True)
    runnable = [d for d in defects if d.device in devices]
    outcomes: dict[str, Outcome] = {}
    for d in defects:
        if d.device not in devices:
            outcomes[d.name] = Outcome(
                d.name,
                d.device,
                d.path,
                d.description,
                NOT_RUN,
                detail=f"no {d.device} device here",
            )
    base = Path(tempfile.mkdtemp(prefix="te-mutation-", dir=scratch))
    spaces = [
        Workspace(project, base / f"copy{i}", log_dir, xdist)
        for i in range(max(1, min(jobs, len(runnable))))
    ]
    free: queue.Queue[Workspace] = queue.Queue()
    for ws in spaces:
        free.put(ws)
    lock = threading.Lock()
    done = [0]

    def task(defect: Defect) -> Outcome:
        ws = free.get()
        try:
            outcome = ws.run_defect(defect, project.suites[defect.device])
        finally:
            free.put(ws)
        outcome.known_gap = known_gaps.get(defect.name)
        return outcome

    try:
        with ThreadPoolExecutor(len(spaces)) as pool:
            futures = [pool.submit(task, d) for d in _order(runnable)]
            for future in as_completed(futures):
                o = future.result()
                outcomes[o.name] = o
                with lock:
                    done[0] += 1
                    progress(progress_line(o, done[0], len(runnable)))
                    if on_outcome:
                        on_outcome([outcomes[d.name] for d in defects if d.name in outcomes])
        caught = [o for o in outcomes.values() if o.result == CAUGHT]
        if caught:
            start = time.monotonic()
            with open(log_dir / "_verify.log", "w") as log:
                spaces[0].verify(caught, log)
            progress(f"re-ran {len(caught)} killing tests without the defects "
                     f"({time.monotonic() - start:.0f} s)")  # fmt: skip
    finally:
        if keep:
            progress(f"scratch copies kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    for o in outcomes.values():
        o.known_gap = known_gaps.get(o.name)
    return [outcomes[d.name] for d in defects]


def progress_line(o: Outcome, i: int, n: int) -> str:
    what = o.test if o.result == CAUGHT else o.detail
    gap = " (known gap)" if o.known_gap and o.result == SURVIVED else ""
    return f"[{i:>2}/{n}] {o.name:<32} {o.device:<4} {o.result:<8}{gap} {o.seconds:7.1f}s  {what}"


def verdict(outcomes: list[Outcome]) -> tuple[int, list[str]]:
    """(exit status, reasons): 1 on errors or survivors that are no known gap, 2 when nothing
    ran, else 0."""
    reasons = []
    errors = [o.name for o in outcomes if o.result == ERROR]
    survivors = [o.name for o in outcomes if o.result == SURVIVED and not o.known_gap]
    if errors:
        reasons.append(f"{len(errors)} defect(s) could not be judged: {', '.join(errors)}")
    if survivors:
        reasons.append(
            f"{len(survivors)} survivor(s) that are no known gap: {', '.join(survivors)}"
        )
    if errors or survivors:
        return 1, reasons
    if outcomes and all(o.result == NOT_RUN for o in outcomes):
        return 2, ["no defect could run on this machine"]
    return 0, reasons


def notes(outcomes: list[Outcome]) -> list[str]:
    """What does not fail the run but should be acted on."""
    caught_gaps = [o.name for o in outcomes if o.known_gap and o.result == CAUGHT]
    out = []
    if caught_gaps:
        out.append(
            f"known gaps caught in this run: {', '.join(caught_gaps)} (drop a KNOWN_GAPS entry "
            "once a deterministic case, not only a fuzz draw, catches it)"
        )
    not_run = [o.name for o in outcomes if o.result == NOT_RUN]
    if not_run:
        out.append(f"{len(not_run)} defect(s) not run here (no device): {', '.join(not_run)}")
    return out


# ----------------------------------------------------------------------------- output


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> dict:
    env = {
        "python": platform.python_version(),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return env


def kill_matrix(outcomes: list[Outcome], args: dict, total_s: float) -> dict:
    """The JSON kill matrix: every defect's outcome, counts, timing, environment, verdict."""
    status, reasons = verdict(outcomes)
    by_device: dict[str, float] = {}
    for o in outcomes:
        by_device[o.device] = round(by_device.get(o.device, 0.0) + o.seconds, 1)
    return {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "environment": environment(),
        "arguments": args,
        "total_s": round(total_s, 1),
        "defect_seconds_by_device": by_device,
        "counts": {r: sum(o.result == r for o in outcomes) for r in RESULTS},
        "exit_status": status,
        "reasons": reasons,
        "notes": notes(outcomes),
        "results": [asdict(o) for o in outcomes],
    }


def write_outputs(matrix: dict, out_dir: Path) -> tuple[Path, Path]:
    from te_conformance.reports.render import mutation_markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "mutation.json", out_dir / "mutation.md"
    js.write_text(json.dumps(matrix, indent=1) + "\n")
    md.write_text(mutation_markdown(matrix) + "\n")
    return js, md


def list_catalogue(defects) -> str:
    width = max(len(d.name) for d in defects)
    lines = []
    for d in defects:
        gap = "  [known gap]" if d.name in KNOWN_GAPS else ""
        lines.append(f"{d.name:<{width}}  {d.device:<4}  {d.description}{gap}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.mutation",
        description="Plant each catalogued defect (tools/mutation/catalogue.py) in a scratch "
        "copy, run the suites, and write the kill matrix.",
    )
    p.add_argument("--list", action="store_true", help="print the catalogue and exit")
    p.add_argument("--only", metavar="NAME[,NAME]", help="run only these defects")
    p.add_argument("--device", choices=(*DEVICES, "all"), default="all",
                   help="the defects of this device (default all; cuda ones need a CUDA "
                   "device and are NOT RUN without one)")  # fmt: skip
    p.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        help="defects run in parallel, each in its own scratch copy (default 1)",
    )
    p.add_argument(
        "--xdist",
        type=int,
        default=None,
        metavar="N",
        help="pytest -n for a whole-suite-set run (default: cpus / jobs)",
    )
    p.add_argument("--out", default="reports/latest", metavar="DIR",
                   help="where mutation.json, mutation.md and mutation_logs/ go "
                   "(default reports/latest)")  # fmt: skip
    p.add_argument("--scratch", metavar="DIR", help="parent of the scratch copies (default: tmp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch copies")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    defects = list(DEFECTS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {d.name for d in defects}]
        if unknown:
            print(f"unknown defect(s): {', '.join(unknown)} (see --list)", file=sys.stderr)
            return 2
        defects = [d for d in defects if d.name in names]
    if args.device != "all":
        defects = [d for d in defects if d.device == args.device]
    if args.list:
        print(list_catalogue(defects))
        return 0
    devices = ("cpu", "cuda") if any(d.device == "cuda" for d in defects) and cuda_available() \
        else ("cpu",)  # fmt: skip
    jobs = max(1, args.jobs)
    xdist = args.xdist if args.xdist is not None else max(1, (os.cpu_count() or 1) // jobs)
    if importlib.util.find_spec("xdist") is None:
        xdist = 0
    out = Path(args.out)
    out = out if out.is_absolute() else ROOT / out
    print(f"{len(defects)} defects, devices here: {', '.join(devices)}, {jobs} job(s), "
          f"whole-suite runs with -n {xdist}; logs in {out / 'mutation_logs'}")  # fmt: skip
    start = time.monotonic()
    arguments = {k: v for k, v in vars(args).items() if k != "list"}

    def partial(done: list[Outcome]) -> None:
        matrix = kill_matrix(done, arguments, time.monotonic() - start)
        matrix["partial"] = (
            f"partial: {sum(o.result != NOT_RUN for o in done)} defects judged so far, "
            "their killing tests not yet re-run without the defect"
        )
        write_outputs(matrix, out)

    outcomes = run_mutations(
        Project(ROOT), defects, devices=devices, jobs=jobs, xdist=xdist,
        log_dir=out / "mutation_logs",
        scratch=Path(args.scratch) if args.scratch else None, keep=args.keep,
        on_outcome=partial,
    )  # fmt: skip
    total = time.monotonic() - start
    matrix = kill_matrix(outcomes, arguments, total)
    js, md = write_outputs(matrix, out)
    counts = ", ".join(f"{n} {r}" for r, n in matrix["counts"].items() if n)
    print(f"\n{counts}; total {total:.0f} s")
    for line in matrix["reasons"] + matrix["notes"]:
        print(f"  - {line}")
    print(f"kill matrix: {js}\n             {md}")
    if (out / "report.json").exists():
        print(f"into the report: python -m te_conformance render {out / 'report.json'}")
    return matrix["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
