"""The baseline: what a good run of one implementation gave, per stable case key, compactly.

A baseline holds, for every case of the run it was made from, its outcome, its worst ratio and
tensor, the tensors it compared and what -k/-m see of it (so that a later subset run can be
applied to it), keyed by the case key (reports.model.case_key); beside them the machine
fingerprint the ratios were measured on (reports.env.fingerprint), where the run came from, the
coverage loss accepted into it and a rename map for moved or renamed tests. No tracebacks, no
durations: a baseline changes only where a case's outcome, ratio or checks change.

The file is JSON with one case a line, so that a diff shows the cases that moved. Reading also
accepts a whole report (report.json), so that any report can serve as a baseline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from te_conformance.reports.model import (
    OUTCOMES,
    ReportError,
    case_key,
    ratio_of,
    read_json,
    validate,
    worst_tensor,
)

SCHEMA = "te-conformance-baseline"
SCHEMA_VERSION = 1
# what the baseline keeps of the run it was made from (environment keys)
MADE_FROM = ("git_commit", "date_utc", "machine_class", "impls", "impl_versions", "torch",
             "torch_cuda", "gpus", "python", "hostname", "selection", "shard")  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One case of a baseline (or of a report, read the same way)."""

    key: str
    nodeid: str
    outcome: str
    ratio: float | None = None  # the worst compared tensor's ratio
    tensor: str | None = None  # and its name
    checked: tuple[str, ...] = ()  # the tensors the case compared
    marks: tuple[str, ...] | None = None  # what -m sees (None: not recorded)
    keywords: tuple[str, ...] | None = None  # what -k sees besides the name (None: not recorded)
    reason: str | None = None  # why it skipped or xfailed (a baseline keeps the xfail reasons)
    examples: int | None = None  # a fuzz case's budget: the examples it asked to draw


@dataclass
class Baseline:
    """A loaded baseline: entries by key, the fingerprint and the run it was made from."""

    entries: dict[str, Entry]
    fingerprint: dict | None = None
    made_from: dict = field(default_factory=dict)
    accepted_loss: dict | None = None
    renames: dict[str, str] = field(default_factory=dict)
    source: str = ""


def entry_of(case: dict) -> Entry:
    """A report case as a baseline entry."""
    worst = worst_tensor(case)
    checked = sorted({t.get("name") for t in case.get("tensors") or []
                      if ratio_of(t) is not None and t.get("name")})  # fmt: skip
    marks, keywords = case.get("marks"), case.get("keywords")
    return Entry(
        key=case.get("key") or case_key(case["nodeid"]),
        nodeid=case["nodeid"],
        outcome=case["outcome"],
        ratio=ratio_of(worst) if worst else None,
        tensor=worst.get("name") if worst else None,
        checked=tuple(checked),
        marks=None if marks is None else tuple(marks),
        keywords=None if keywords is None else tuple(keywords),
        reason=case.get("skip_reason") if case["outcome"] in ("skipped", "xfailed") else None,
        examples=_count((case.get("fields") or {}).get("fuzz_examples")),
    )


def _count(value) -> int | None:
    """A recorded count (a fuzz budget): an int >= 0, else None (not recorded, or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def entries_of_report(report: dict) -> dict[str, Entry]:
    """A report's cases as entries by key (a key met twice is a ReportError)."""
    entries: dict[str, Entry] = {}
    for case in report["cases"]:
        e = entry_of(case)
        if e.key in entries:
            raise ReportError(
                f"{entries[e.key].nodeid} and {e.nodeid} have the same case key {e.key!r}"
            )
        entries[e.key] = e
    return entries


def from_report(report: dict, accepted_loss: dict | None = None,
                renames: dict[str, str] | None = None) -> Baseline:  # fmt: skip
    """The baseline a report makes."""
    env = report["environment"]
    made_from = {k: env.get(k) for k in MADE_FROM if env.get(k) is not None}
    made_from["summary"] = {k: v for k, v in report["summary"].items() if k != "duration_s"}
    return Baseline(
        entries_of_report(report),
        env.get("fingerprint"),
        made_from,
        accepted_loss,
        dict(renames or {}),
    )


def _renamed(key: str, renames: dict[str, str]) -> str:
    """A key through the rename map: an exact entry, or one naming a whole test function
    ("test_x::test_old" renames every "test_x::test_old[...]")."""
    if key in renames:
        return renames[key]
    name, bracket, params = key.partition("[")
    if bracket and name in renames:
        return f"{renames[name]}[{params}"
    return key


def _encode(e: Entry, tags: dict[tuple, int]) -> dict:
    d: dict = {"outcome": e.outcome}
    if e.ratio is not None:
        d["ratio"] = e.ratio if e.ratio != float("inf") else "inf"
        d["tensor"] = e.tensor
    if e.checked:
        d["checked"] = list(e.checked)
    if e.marks is not None or e.keywords is not None:
        tag = (e.marks, e.keywords)
        d["tags"] = tags.setdefault(tag, len(tags))
    if e.reason and e.outcome == "xfailed":
        d["reason"] = e.reason
    if e.examples is not None:
        d["examples"] = e.examples
    return d


def dumps(b: Baseline) -> str:
    """The baseline file's text: the header, then one case a line, sorted by key."""
    tags: dict[tuple, int] = {}
    files: dict[str, str] = {}
    cases = []
    for key in sorted(b.entries):
        e = b.entries[key]
        path = e.nodeid.partition("::")[0]
        stem = key.partition("::")[0]
        if files.setdefault(stem, path) != path:  # one stem, two paths: keep the node id
            cases.append((key, {**_encode(e, tags), "nodeid": e.nodeid}))
        else:
            cases.append((key, _encode(e, tags)))
    head = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "fingerprint": b.fingerprint,
        "made_from": b.made_from,
        "accepted_loss": b.accepted_loss,
        "renames": b.renames,
        "files": files,
        "tags": [{"marks": None if m is None else list(m),
                  "keywords": None if k is None else list(k)} for m, k in tags],  # fmt: skip
    }
    lines = [json.dumps(head, indent=1, sort_keys=True, allow_nan=False)[:-2] + ',\n "cases": {']
    body = [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True, allow_nan=False)}"
            for k, v in cases]  # fmt: skip
    return lines[0] + ("\n" + ",\n".join(body) + "\n" if body else "") + " }\n}\n"


def write(b: Baseline, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(b), encoding="utf-8")
    tmp.replace(path)


def _decode(data: dict, source: str) -> Baseline:
    def bad(what: str) -> ReportError:
        return ReportError(f"{source}: {what}")

    if data.get("schema_version") != SCHEMA_VERSION:
        raise bad(f"unsupported baseline schema_version {data.get('schema_version')!r} "
                  f"(this tool reads version {SCHEMA_VERSION})")  # fmt: skip
    for name, kind in (("cases", dict), ("files", dict), ("tags", list), ("renames", dict)):
        if not isinstance(data.get(name), kind):
            raise bad(f"'{name}' is missing or not a{'n object' if kind is dict else ' list'}")
    files, tags, renames = data["files"], data["tags"], data["renames"]
    entries: dict[str, Entry] = {}
    for key, d in data["cases"].items():
        if not isinstance(d, dict) or d.get("outcome") not in OUTCOMES:
            raise bad(f"case {key!r} has no valid outcome")
        stem, _, rest = key.partition("::")
        nodeid = d.get("nodeid") or f"{files.get(stem, stem + '.py')}::{rest}"
        tag = tags[d["tags"]] if isinstance(d.get("tags"), int) and d["tags"] < len(tags) else {}
        ratio = d.get("ratio")
        new_key = _renamed(key, renames)
        if new_key != key:  # the new test's file where the baseline knows it (moved tests)
            new_stem, _, new_rest = new_key.partition("::")
            path = files.get(new_stem) if new_stem != stem else None
            nodeid = (path or nodeid.partition("::")[0]) + "::" + new_rest
        entries[new_key] = Entry(
            key=new_key,
            nodeid=nodeid,
            outcome=d["outcome"],
            ratio=None if ratio is None else float(ratio),
            tensor=d.get("tensor"),
            checked=tuple(d.get("checked") or ()),
            marks=None if tag.get("marks") is None else tuple(tag["marks"]),
            keywords=None if tag.get("keywords") is None else tuple(tag["keywords"]),
            reason=d.get("reason"),
            examples=_count(d.get("examples")),
        )
    return Baseline(entries, data.get("fingerprint"), data.get("made_from") or {},
                    data.get("accepted_loss"), dict(renames), source)  # fmt: skip


def parse(data, source: str) -> Baseline:
    """A baseline from parsed JSON: a baseline file, or a whole report."""
    if isinstance(data, dict) and data.get("schema") == SCHEMA:
        return _decode(data, source)
    report = validate(data, source)  # a report (ReportError if it is neither)
    b = from_report(report, report.get("accepted_loss"))
    b.source = source
    return b


def load(path: str | Path) -> Baseline:
    """Read a baseline file or a report as a baseline (ReportError with a one-line reason)."""
    return parse(read_json(Path(path)), str(path))


def add_rename(path: str | Path, old: str, new: str) -> int:
    """Record in the baseline file at ``path`` that the case (or the whole test function)
    ``old`` is now ``new``; returns how many of its cases move (none is a ReportError)."""
    raw = read_json(Path(path))
    if not (isinstance(raw, dict) and raw.get("schema") == SCHEMA):
        raise ReportError(f"{path}: not a baseline file (renames live in baselines)")
    b = _decode({**raw, "renames": {}}, str(path))  # the keys as stored
    moved = [k for k in b.entries if _renamed(k, {old: new}) != k]
    if not moved:
        raise ReportError(f"{path}: no case has the key {old!r} or is a case of that test")
    b.renames = {**raw["renames"], old: new}
    write(b, path)
    return len(moved)
