"""The report JSON: building, loading with validation, and helpers over its cases."""

from __future__ import annotations

import json
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = "te-conformance-report"
SCHEMA_VERSION = 1
OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", "xpassed")
FAILING = ("failed", "error")
# What `python -m te_conformance run` judges when no paths are given: the suites, never the tool's
# own tests (tests/, run by `pytest -n auto tests`).
DEFAULT_SCOPE = ("suites",)
# The implementation the default run (no --impl) judges. Its cases' ids name no adapter, so a run
# of --impl DEFAULT_IMPL alone has the default run's case keys and answers to its baseline (for
# the cases it selects: the suites run the tests that take an adapter, as -m conformance).
DEFAULT_IMPL = "te_fast"


class ReportError(Exception):
    """A report file that is missing, unreadable or not a te-conformance report."""


def case_key(nodeid: str) -> str:
    """A case's stable key: its test file's stem, then the node id's names and parameters
    ('suites/conformance/test_x.py::test_y[bf16]' -> 'test_x::test_y[bf16]'). It does not change
    with the rootdir, the directory the suites are installed in, or a move of the file
    to another folder; baselines are keyed by it (reports.baseline), and a renamed test is carried
    over by the baseline's rename map."""
    path, sep, rest = nodeid.partition("::")
    if not sep:
        return nodeid
    stem = path.rstrip("/").rsplit("/", 1)[-1]
    stem = stem[:-3] if stem.endswith(".py") else stem
    return f"{stem}::{rest}"


def to_float(value: Any) -> float | None:
    """A ratio/error as float: non-finite values arrive as strings ('inf', 'nan')."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def summarize(
    cases: list[dict],
    duration_s: float | None = None,
    interrupted: str | None = None,
    collected: int | None = None,
) -> dict:
    """Counts per outcome (every outcome present, zeros included), total and wall time; for a run
    that was stopped before its end, what stopped it (`interrupted`, e.g. "SIGTERM") and how many
    tests it had collected: such a report is partial."""
    counts = Counter(c["outcome"] for c in cases)
    summary: dict = {o: counts.get(o, 0) for o in OUTCOMES}
    summary["total"] = len(cases)
    summary["duration_s"] = duration_s
    if interrupted:
        summary["interrupted"] = interrupted
        summary["collected"] = collected
    return summary


def build_report(
    cases: list[dict],
    environment: dict,
    duration_s: float | None = None,
    interrupted: str | None = None,
    collected: int | None = None,
) -> dict:
    """A complete report dict (cases sorted by nodeid, summary computed)."""
    cases = sorted(cases, key=lambda c: c["nodeid"])
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "environment": environment,
        "summary": summarize(cases, duration_s, interrupted, collected),
        "cases": cases,
    }


def interrupted(report: dict) -> str | None:
    """What stopped the run before its end (a partial report), or None for a whole run."""
    return report["summary"].get("interrupted") or None


def validate(data: Any, source: str) -> dict:
    """Return data if it is a report, else raise ReportError naming source and the problem."""

    def bad(what: str) -> ReportError:
        return ReportError(f"{source}: {what}")

    if not isinstance(data, dict):
        raise bad(f"expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise bad(
            f"not a te-conformance report (schema is {data.get('schema')!r}, expected {SCHEMA!r})"
        )
    if data.get("schema_version") != SCHEMA_VERSION:
        raise bad(
            f"unsupported schema_version {data.get('schema_version')!r} "
            f"(this tool reads version {SCHEMA_VERSION})"
        )
    for key, kind in (("environment", dict), ("summary", dict), ("cases", list)):
        if not isinstance(data.get(key), kind):
            raise bad(f"'{key}' is missing or not a {'list' if kind is list else 'object'}")
    if not isinstance(data["summary"].get("interrupted") or "", str):
        raise bad("'summary.interrupted' is not a string")
    # optional, added after version 1 was fixed: a report without them is as valid as before
    for key in ("verdict", "accepted_loss"):
        if not isinstance(data.get(key) or {}, dict):
            raise bad(f"'{key}' is not an object")
    if not isinstance(data["environment"].get("selection") or {}, dict):
        raise bad("'environment.selection' is not an object")
    for i, case in enumerate(data["cases"]):
        if not isinstance(case, dict) or not isinstance(case.get("nodeid"), str):
            raise bad(f"cases[{i}] has no 'nodeid'")
        if case.get("outcome") not in OUTCOMES:
            raise bad(f"cases[{i}] ({case['nodeid']}) has unknown outcome {case.get('outcome')!r}")
        if not isinstance(case.get("tensors", []), list):
            raise bad(f"cases[{i}] ({case['nodeid']}) 'tensors' is not a list")
    return data


def read_json(path: str | Path):
    """A JSON file's contents (ReportError with a one-line reason when it cannot be read)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON ({e})") from None


def load_report(path: str | Path) -> dict:
    """Read and validate a report JSON file (ReportError with a one-line reason otherwise)."""
    return validate(read_json(path), str(path))


def write_report(report: dict, path: str | Path) -> None:
    """Write pretty, key-sorted JSON (stable diffs for committed baselines)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=1, sort_keys=True, allow_nan=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a file


def ratio_of(tensor: dict) -> float | None:
    """A tensor entry's ratio; nan (and -inf, which no error/bound gives) counts as inf: a
    non-finite comparison is never a small ratio."""
    r = to_float(tensor.get("ratio"))
    return math.inf if r is not None and not math.isfinite(r) else r


def worst_tensor(case: dict) -> dict | None:
    """The compared tensor with the largest ratio, or None if the case compared none."""
    rated = [t for t in case.get("tensors") or [] if ratio_of(t) is not None]
    return max(rated, key=ratio_of) if rated else None


def worst_ratio(case: dict) -> float | None:
    """The largest ratio among the case's tensors (None when nothing was compared)."""
    t = worst_tensor(case)
    return None if t is None else ratio_of(t)


def field(case: dict, name: str) -> str:
    """A case field as display text; missing values group as "-"."""
    value = (case.get("fields") or {}).get(name)
    if value is None or value == "":
        return "-"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def bucket(outcome: str) -> str:
    """pass / fail / skip, the three columns of the summary tables."""
    if outcome in FAILING:
        return "fail"
    return "skip" if outcome in ("skipped", "xfailed") else "pass"


def failures(report: dict) -> list[dict]:
    """Cases that failed or errored."""
    return [c for c in report["cases"] if c["outcome"] in FAILING]


def fmt_ratio(value: float | None) -> str:
    """A ratio for tables: 3 significant digits, '-' when absent."""
    if value is None:
        return "-"
    return f"{value:.3g}" if math.isfinite(value) else repr(float(value))


def fmt_num(value: Any) -> str:
    """An error/bound for tables."""
    v = to_float(value)
    return "-" if v is None else f"{v:.3g}"


def _under(nodeid: str, path: str) -> bool:
    """Whether nodeid lies under a selection path ('.', a directory, a file or a node id)."""
    path = path.rstrip("/")
    if path in (".", ""):
        return True
    return nodeid == path or nodeid.startswith((path + "/", path + "::", path + "["))


def _item_name(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[-1]


def keyword_names(nodeid: str, keywords: list[str]) -> set[str]:
    """The names -k matches for a recorded case: its recorded keywords (reports.plugin
    selection_tags), its own name and its parameter id."""
    name = _item_name(nodeid)
    m = re.search(r"\[(.*)\]$", name)
    return {*keywords, name, *([m.group(1)] if m else [])}


class SelectionError(Exception):
    """A selection that cannot be applied to recorded cases (said why)."""


def _expression(text: str, flag: str):
    """pytest's own -k/-m grammar (the same parser the run used)."""
    try:
        from _pytest.mark.expression import Expression
    except ImportError as e:  # pragma: no cover - pytest is a dependency of the plugin
        raise SelectionError(f"{flag} cannot be evaluated without pytest: {e}") from None
    try:
        return Expression.compile(text)
    except Exception as e:  # pytest's ParseError
        raise SelectionError(f"{flag} {text!r} does not parse: {e}") from None


def _keyword_matcher(names: set[str]):
    lowered = [n.lower() for n in names]

    def match(subname: str, /, **kwargs) -> bool:
        if kwargs:
            raise SelectionError("-k takes no call parameters")
        sub = subname.lower()
        return any(sub in n for n in lowered)

    return match


def _mark_matcher(marks: set[str]):
    def match(name: str, /, **kwargs) -> bool:
        if kwargs:  # -m "name(arg=...)": the recorded marks keep names only
            raise SelectionError("-m with marker arguments cannot be applied to recorded cases")
        return name in marks

    return match


@dataclass(frozen=True)
class Scope:
    """Which cases a run was meant to run. A complete run (no -k/-m/--deselect/--lf/--te-shard,
    and the default paths or paths that include them) answers for every baseline case under its
    paths: one that did not run is missing. A subset run answers for every baseline case its
    selection selects (``selects``: the same paths, -k, -m, --deselect and shard applied to the
    case as the baseline recorded it); only a selection that cannot be applied to recorded cases
    (--lf, shards that selected differently) answers for the cases it ran alone."""

    complete: bool
    paths: tuple[str, ...] = ()  # () or ("."): everything
    narrowed_by: tuple[str, ...] = ()  # what made it a subset, for people
    keyword: str | None = None
    markexpr: str | None = None
    deselect: tuple[str, ...] = ()
    shard: str | None = None
    unapplicable: tuple[str, ...] = ()  # why the selection cannot be applied to recorded cases

    def covers(self, nodeid: str) -> bool:
        return not self.paths or any(_under(nodeid, p) for p in self.paths)

    def selects(self, nodeid: str, key: str, marks, keywords) -> bool:
        """Whether this run's selection selects a recorded case (node id, case key, marks and
        keywords as reports.plugin recorded them); SelectionError where it cannot tell (a case
        recorded without keywords under -k, say)."""
        if self.unapplicable:
            raise SelectionError("; ".join(self.unapplicable))
        if not self.covers(nodeid):
            return False
        if self.deselect and nodeid.startswith(self.deselect):
            return False
        if self.shard:
            i, _, n = self.shard.partition("/")
            if zlib.crc32(key.encode()) % int(n) != int(i) - 1:
                return False
        if self.markexpr:
            if marks is None:
                raise SelectionError("the baseline recorded no marks for its cases")
            if not _expression(self.markexpr, "-m").evaluate(_mark_matcher(set(marks))):
                return False
        if self.keyword:
            if keywords is None:
                raise SelectionError("the baseline recorded no keywords for its cases")
            names = keyword_names(nodeid, keywords)
            if not _expression(self.keyword, "-k").evaluate(_keyword_matcher(names)):
                return False
        return True

    def describe(self) -> str:
        where = " ".join(self.paths) if self.paths else "every collected test"
        if self.complete:
            return f"full run ({where}): every baseline case under these paths must run"
        if self.unapplicable:
            return (
                f"subset run ({'; '.join(self.narrowed_by)}): compared with the baseline only on "
                f"the cases it ran ({'; '.join(self.unapplicable)})"
            )
        return (
            f"subset run ({'; '.join(self.narrowed_by)}): every baseline case this selection "
            "selects must run"
        )

    @property
    def kind(self) -> str:
        return "full" if self.complete else "subset"


WHOLE = Scope(True)


def run_scope(report: dict) -> Scope:
    """The scope of a report's run, from environment.selection (reports.plugin). A report without
    one (written before it was recorded) counts as a full run of everything it holds."""
    env = report["environment"]
    sel = env.get("selection")
    if not isinstance(sel, dict):
        return WHOLE
    narrowed, unapplicable = [], []
    if sel.get("keyword"):
        narrowed.append(f"-k {sel['keyword']}")
    if sel.get("markexpr"):
        narrowed.append(f"-m {sel['markexpr']}")
    if sel.get("deselect"):
        narrowed.append(f"--deselect ({len(sel['deselect'])})")
    if sel.get("last_failed"):
        narrowed.append("--lf")
        unapplicable.append("--lf selects by an earlier run's failures")
    shard = str(env["shard"]) if env.get("shard") else None
    if shard:
        narrowed.append(f"--te-shard {shard}")
        if not re.fullmatch(r"\d+/\d+", shard):
            unapplicable.append(f"unreadable shard {shard!r}")
    if sel.get("mixed"):
        narrowed.append("shards that ran different selections")
        unapplicable.append("its shards ran different selections")
    paths = tuple(str(p) for p in sel.get("paths") or ())
    everything = not paths or any(p.rstrip("/") in (".", "") for p in paths)
    default_covered = all(any(_under(d, p) for p in paths) for d in DEFAULT_SCOPE)
    if not (everything or sel.get("default_paths") or default_covered):
        narrowed.append("paths " + " ".join(paths))
    return Scope(
        not narrowed,
        () if everything else paths,
        tuple(narrowed),
        keyword=sel.get("keyword") or None,
        markexpr=sel.get("markexpr") or None,
        deselect=tuple(sel.get("deselect") or ()),
        shard=shard,
        unapplicable=tuple(unapplicable),
    )
