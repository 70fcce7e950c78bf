"""The conformance matrix: features against implementations, from the reports of several runs.

`python -m te_conformance matrix RUN.json...` reads report.json files (one run per
implementation, from `python -m te_conformance run --impl NAME`) and draws one table. A row is a
feature of the catalogue the runs recorded (environment.features: the suites' feature
catalogue, suites/features.py); a column is an implementation; a cell sums up the run's cases of
that implementation (their recorded ``adapter``) that recorded that feature: conformant, not
conformant (how many failed and one reproducer), a recorded deviation (expected failures: TE
deviations, known failures, declared differences), not supported (skips of kind "declined", the
most common reason about the row's feature; a case that ran without a feature it asked for,
its ``declined_features``, counts there as declined) or not run. The matrix reads the recorded
fields alone: no test name, no message text, nothing of the suites.

Written as matrix.md, matrix.html (self-contained) and matrix.png (matplotlib; skipped with a
message without it), with matrix.json, the matrix as data. docs/reports.md describes it.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import re
from collections import Counter
from pathlib import Path

from te_conformance.reports.model import FAILING, ReportError, load_report, validate
from te_conformance.reports.render import reproducer

SCHEMA = "te-conformance-matrix"
SCHEMA_VERSION = 2
PNG_KEY = b"te-conformance-matrix"  # the PNG's tEXt chunk: the sha256 of the matrix it draws
# what a compact copy of a run keeps of each case (summarize_run)
KEPT = ("nodeid", "outcome", "adapter", "features", "declined_features", "skip", "expected")

# ------------------------------------------------------------------------------------- cells

STATES = {
    # state: (label, fill colour, text colour); a not-conformant cell is never green
    "pass": ("conformant", "#8fd19e", "#0b3d17"),
    "partial": ("conformant where supported", "#d7efc8", "#24471a"),
    "fail": ("not conformant", "#f28b82", "#5c0b05"),
    "known": ("recorded deviation (expected failure)", "#ffd27f", "#5a3b00"),
    "unsupported": ("not supported", "#d9d9d9", "#333333"),
    "not_run": ("not run", "#ffffff", "#777777"),
}
STATE_HELP = {
    "pass": "every case of the feature passed",
    "partial": "the cases it runs pass; the others skip as not supported (the count and the "
    "most common reason)",
    "fail": "a case failed or errored: the failing count and one reproducer",
    "known": "no unexpected failure, but cases fail as expected differences (strict: TE "
    "deviations, known failures, an adapter's declared differences)",
    "unsupported": "every case skipped, declined by the implementation's adapter (skips of kind "
    "\"declined\"): the most common reason",
    "not_run": "no run of this implementation, no case of the feature in its run, or only skips "
    "that are not the implementation's (a missing device or package, a combination that does "
    "not exist: the reason)",
}

# a value a reason quotes ('thd_thd_thd', 'off-by-one'): reasons that differ only there group
_QUOTED = re.compile(r"(?<=[\s(])'[\w.+-]+'")


def skip_reasons(case: dict) -> list[dict]:
    """The recorded reasons of a skipped case, [{"text", "feature"}]; for an xfailed case its
    expected differences (their title or reason)."""
    if case["outcome"] == "xfailed":
        found = [{"text": e.get("title") or e.get("reason") or "-", "feature": None}
                 for e in case.get("expected") or []]  # fmt: skip
        return found or [{"text": "-", "feature": None}]
    skip = case.get("skip") or {}
    found = [r for r in skip.get("reasons") or [] if isinstance(r, dict)]
    return found or [{"text": case.get("skip_reason") or "-", "feature": None}]


def declined(case: dict) -> bool:
    """Whether a skipped case was turned away by its implementation's adapter (its recorded
    skip kind), not by this machine or by a combination that does not exist."""
    return (case.get("skip") or {}).get("kind") == "declined"


def declined_part(case: dict, feature: str) -> dict | None:
    """The part of a case its adapter declined, as a skip of kind "declined" about ``feature``:
    a case that asked for the feature and ran without it (its recorded ``declined_features``:
    a substituted variant, max_logit left out), None where it did not. The rest of the case
    counts in the rows of the features it ran with."""
    texts = [d.get("text") or "-" for d in case.get("declined_features") or []
             if isinstance(d, dict) and d.get("feature") == feature]  # fmt: skip
    if not texts:
        return None
    reasons = [{"text": t, "feature": feature} for t in texts]
    return {**case, "outcome": "skipped", "skip": {"kind": "declined", "reasons": reasons}}


def main_reason(cases: list[dict], feature: str | None = None) -> tuple[str, int, int]:
    """(reason, how many of the cases give it, how many distinct reasons they give): the reason
    the most cases give, those about ``feature`` (the row's) first; reasons that differ only in
    a quoted value count as one, shown with their values ("... 't3hd', 'thd_thd_thd'")."""
    variants: dict[str, Counter] = {}  # template -> its texts with their counts
    count: Counter = Counter()  # template -> cases that give it
    about: set[str] = set()  # templates of a reason about the feature
    for c in cases:
        reasons = skip_reasons(c)
        for template in {_QUOTED.sub("'*'", r.get("text") or "-") for r in reasons}:
            count[template] += 1
        for r in reasons:
            template = _QUOTED.sub("'*'", r.get("text") or "-")
            variants.setdefault(template, Counter())[r.get("text") or "-"] += 1
            if feature is not None and r.get("feature") == feature:
                about.add(template)
    best = min(count, key=lambda tpl: (tpl not in about, -count[tpl], tpl))
    texts = variants[best]
    if len(texts) == 1:
        text = next(iter(texts))
    elif best.count("'*'") == 1:
        values = sorted({_QUOTED.search(x)[0] for x in texts})
        more = f" (+{len(values) - 4} more)" if len(values) > 4 else ""
        text = best.replace("'*'", ", ".join(values[:4]) + more)
    else:
        text, _ = min(texts.items(), key=lambda kv: (-kv[1], kv[0]))
        text += f" (and {len(texts) - 1} like it)"
    return text, count[best], len(count)


def _tally(cases: list[dict], pytest_args: list[str], feature: str) -> dict:
    """One cell from the cases of one feature in one implementation's run. A skip its adapter
    declined counts as not supported; any other skip is not the implementation's (a missing
    device or package, a combination that does not exist): such cases count as not run."""
    passed = sum(c["outcome"] in ("passed", "xpassed") for c in cases)
    failing = sorted((c for c in cases if c["outcome"] in FAILING), key=lambda c: c["nodeid"])
    skips = [c for c in cases if c["outcome"] == "skipped"]
    own = [c for c in skips if declined(c)]
    other = [c for c in skips if not declined(c)]
    xfailed = [c for c in cases if c["outcome"] == "xfailed"]
    cell: dict = {"cases": len(cases), "passed": passed, "failed": len(failing),
                  "skipped": len(own), "xfailed": len(xfailed)}  # fmt: skip
    if other:
        cell["other_skips"] = len(other)
    if failing:
        cell["state"] = "fail"
        cell["nodeid"] = failing[0]["nodeid"]
        cell["reproducer"] = reproducer(failing[0], pytest_args)
    elif xfailed:
        cell["state"] = "known"
    elif passed:
        cell["state"] = "partial" if own else "pass"
    elif own:
        cell["state"] = "unsupported"
    else:
        cell["state"] = "not_run"
    for key, group in (("reason", own or (other if cell["state"] == "not_run" else [])),
                       ("known_reason", xfailed)):  # fmt: skip
        if group:
            cell[key], cell[f"{key}_cases"], cell[f"{key}s"] = main_reason(group, feature)
    return cell


NOT_RUN = {"state": "not_run", "cases": 0, "passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}

# ------------------------------------------------------------------------------------- runs


def run_impls(report: dict, source: str) -> list[str]:
    """The implementations a run judged (environment.impls), else a ReportError."""
    impls = report["environment"].get("impls")
    if not isinstance(impls, list) or not all(isinstance(n, str) and n for n in impls):
        raise ReportError(f"{source}: 'environment.impls' is missing or not a list of names")
    if not impls:
        raise ReportError(
            f"{source}: the report does not say which implementation it judged (empty "
            "environment.impls); make it with `python -m te_conformance run --impl NAME`"
        )
    return list(dict.fromkeys(impls))


def run_catalogue(report: dict, source: str) -> list[dict]:
    """The feature catalogue a run recorded (environment.features), else a ReportError."""
    found = report["environment"].get("features")
    if not isinstance(found, list) or not all(
        isinstance(f, dict) and isinstance(f.get("key"), str) for f in found
    ):
        raise ReportError(
            f"{source}: the report records no feature catalogue (environment.features): a run "
            "of an older version; run it again with `python -m te_conformance run --impl NAME`"
        )
    return found


def _run_info(report: dict) -> dict:
    env = report["environment"]
    sel = env.get("selection") or {}
    verdict = report.get("verdict") or {}
    return {
        "torch": env.get("torch"),
        "python": env.get("python"),
        "machine_class": env.get("machine_class"),
        "git_commit": env.get("git_commit"),
        "date_utc": env.get("date_utc"),
        "selection": {k: sel.get(k) for k in ("paths", "keyword", "markexpr") if sel.get(k)},
        "verdict": verdict.get("status"),
    }


def catalogue_of(runs: list[tuple[str, dict]]) -> list[dict]:
    """The rows: the runs' catalogues merged by key, in the order they first name them."""
    rows: dict[str, dict] = {}
    for source, report in runs:
        for f in run_catalogue(report, source):
            fields = {k: str(f.get(k) or "") for k in ("key", "group", "label", "rule")}
            rows.setdefault(f["key"], fields)
    return list(rows.values())


def build_matrix(runs: list[tuple[str, dict]], columns: list[str] | None = None) -> dict:
    """The matrix of (source, report) runs: one run per implementation (two runs of one
    implementation are a ReportError). ``columns``: the implementations to show, in order
    (default: those the runs judged, in their order; a named one without a run: not run)."""
    by_impl: dict[str, tuple[str, dict]] = {}
    for source, report in runs:
        for name in run_impls(report, source):
            if name in by_impl:
                raise ReportError(
                    f"implementation {name!r} is judged by two runs: {by_impl[name][0]} and "
                    f"{source}; give one run per implementation"
                )
            by_impl[name] = (source, report)
    rows = catalogue_of(runs)
    columns = list(by_impl) if columns is None else columns
    cells: dict[str, dict[str, dict]] = {f["key"]: {} for f in rows}
    info: dict[str, dict] = {}
    for name in columns:
        if name not in by_impl:
            for f in rows:
                cells[f["key"]][name] = dict(NOT_RUN)
            continue
        source, report = by_impl[name]
        args = list(report["environment"].get("pytest_args") or [])
        own = [c for c in report["cases"] if c.get("adapter") == name]
        counted = set()
        for f in rows:
            mine = [c for c in own if f["key"] in (c.get("features") or ())]
            parts = (declined_part(c, f["key"]) for c in own
                     if f["key"] not in (c.get("features") or ()))  # fmt: skip
            mine += [part for part in parts if part]
            counted.update(c["nodeid"] for c in mine)
            cells[f["key"]][name] = _tally(mine, args, f["key"])
        info[name] = {**_run_info(report), "cases": len(own), "counted": len(counted)}
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "columns": list(columns),
        "rows": [{**f, "cells": cells[f["key"]]} for f in rows],
        "runs": info,
    }


def load_runs(paths: list[str | Path]) -> list[tuple[str, dict]]:
    """(path, report) of each report file (a ReportError for one that is not a report)."""
    if not paths:
        raise ReportError("no report given")
    return [(str(p), load_report(p)) for p in paths]


def summarize_run(report: dict, source: str = "report") -> dict:
    """A compact copy of a run for committing (docs/matrix_runs/): a valid report holding only
    what the matrix reads (the cases of the run's own implementations, their KEPT fields and
    reproducer line), so that build_matrix gives the same matrix from it."""
    impls = run_impls(report, source)
    run_catalogue(report, source)
    env = report["environment"]
    keep_env = ("impls", "pytest_args", "selection", "torch", "python", "machine_class",
                "git_commit", "date_utc", "features")  # fmt: skip
    cases = []
    for c in report["cases"]:
        if c.get("adapter") not in impls:
            continue
        small = {k: c[k] for k in KEPT if c.get(k) not in (None, [], {})}
        if c["outcome"] in ("skipped", "xfailed") and c.get("skip_reason"):
            small["skip_reason"] = c["skip_reason"]
        if c["outcome"] in FAILING:
            small["message"] = (c.get("message") or "").strip().split("\n", 1)[0][:300]
            small["reproducer"] = reproducer(c, env.get("pytest_args"))
        cases.append(small)
    out = {
        "schema": report["schema"],
        "schema_version": report["schema_version"],
        "environment": {**{k: env[k] for k in keep_env if k in env}, "impls": impls},
        "summary": report["summary"],
        "cases": cases,
    }
    if isinstance(report.get("verdict"), dict):
        out["verdict"] = {k: report["verdict"].get(k) for k in ("status", "reasons", "run_kind")}
    return validate(out, source)


def write_summary(summary: dict, path: Path) -> None:
    """One case a line: a small, diffable file."""
    head = {k: v for k, v in summary.items() if k != "cases"}
    text = json.dumps(head, sort_keys=True, indent=1)[:-2]  # without the closing "\n}"
    lines = [json.dumps(c, sort_keys=True) for c in summary["cases"]]
    text += ',\n "cases": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def matrix_json(matrix: dict) -> str:
    return json.dumps(matrix, indent=1, sort_keys=True) + "\n"


def digest(matrix: dict) -> str:
    """sha256 of matrix.json's text: what matrix.png records it draws."""
    return hashlib.sha256(matrix_json(matrix).encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------- text


def cell_text(cell: dict, detail: bool = True) -> str:
    """A cell in words: its state, its counts and (detail) the reproducer or the reason."""
    s = cell["state"]
    n = cell["cases"]
    if s == "pass":
        return f"conformant ({cell['passed']} passed)"
    if s == "partial":
        text = f"conformant ({cell['passed']} passed; {cell['skipped']} not supported"
        return text + (f": {cell['reason']})" if detail else ")")
    if s == "fail":
        text = f"not conformant ({cell['failed']} of {n} failing"
        return text + (f"); reproduce: {cell['reproducer']}" if detail else ")")
    if s == "known":
        text = f"recorded deviation ({cell['xfailed']} of {n} expected failures"
        text += f", {cell['passed']} passed" if cell["passed"] else ""
        return text + (f": {cell['known_reason']})" if detail else ")")
    if s == "unsupported":
        return "not supported" + (f" ({cell['reason']})" if detail else "")
    return "not run" + (f" ({cell['reason']})" if detail and cell.get("reason") else "")


def short_text(cell: dict) -> str:
    """A cell in a few words, for the picture."""
    s = cell["state"]
    if s == "pass":
        return f"{cell['passed']} passed"
    if s == "partial":
        return f"{cell['passed']} passed, {cell['skipped']} n/s"
    if s == "fail":
        return f"{cell['failed']} of {cell['cases']} FAIL"
    if s == "known":
        done = f"{cell['passed']} passed, " if cell["passed"] else ""
        return f"{done}{cell['xfailed']} deviate"
    if s == "unsupported":
        return "not supported"
    return "not run"


_SYMBOL = {"pass": "✅", "partial": "☑️", "fail": "❌", "known": "⚠️", "unsupported": "➖",
           "not_run": "·"}  # fmt: skip


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _runs_lines(matrix: dict) -> list[str]:
    lines = []
    for name in matrix["columns"]:
        r = matrix["runs"].get(name)
        if r is None:
            lines.append(f"- {name}: not run")
            continue
        sel = r["selection"]
        where = " ".join(sel.get("paths") or []) or "the default paths"
        narrowed = "".join(f" {flag} {sel[key]!r}" for flag, key in (("-m", "markexpr"),
                           ("-k", "keyword")) if sel.get(key))  # fmt: skip
        lines.append(
            f"- {name}: {r['cases']} cases ({r['counted']} in a row) of {where}{narrowed}; "
            f"torch {r['torch']}, {r['machine_class']}, commit {r['git_commit']}, "
            f"{r['date_utc']}, verdict {r['verdict']}"
        )
    return lines


def render_markdown(matrix: dict) -> str:
    cols = matrix["columns"]
    lines = [
        "# Conformance matrix",
        "",
        "Features (rows) against implementations (columns), from one run of the conformance "
        "suites per implementation (`python -m te_conformance matrix`; docs/reports.md says which "
        "cases make each row).",
        "",
        "| group | feature | " + " | ".join(map(_md, cols)) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for row in matrix["rows"]:
        cells = [
            f"{_SYMBOL[row['cells'][c]['state']]} {_md(cell_text(row['cells'][c]))}" for c in cols
        ]
        lines.append(f"| {_md(row['group'])} | {_md(row['label'])} | " + " | ".join(cells) + " |")
    lines += ["", "Legend:", ""]
    lines += [f"- {_SYMBOL[s]} **{STATES[s][0]}**: {STATE_HELP[s]}" for s in STATES]
    lines += ["", "Runs:", "", *_runs_lines(matrix), ""]
    return "\n".join(lines)


CSS = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }
th { background: #eee; }
td.group { color: #555; }
td.cell { max-width: 22em; }
td.cell code { font-size: 0.85em; word-break: break-all; }
.legend span { display: inline-block; padding: 0.2em 0.6em; margin: 0 0.4em 0.3em 0;
               border: 1px solid #999; }
.note { color: #666; }
"""


def render_html(matrix: dict) -> str:
    """One self-contained page: inline CSS, nothing fetched."""
    e = html.escape
    cols = matrix["columns"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Conformance matrix</title><style>{CSS}</style></head><body>",
        "<h1>Conformance matrix</h1>",
        '<p class="note">Features (rows) against implementations (columns), from one run of the '
        "conformance suites per implementation (python -m te_conformance matrix).</p>",
        '<p class="legend">'
        + "".join(
            f'<span class="state-{s}" style="background:{bg};color:{fg}" '
            f'title="{e(STATE_HELP[s])}">{e(label)}</span>'
            for s, (label, bg, fg) in STATES.items()
        )
        + "</p>",
        "<table><tr><th>group</th><th>feature</th>"
        + "".join(f"<th>{e(c)}</th>" for c in cols)
        + "</tr>",
    ]
    for row in matrix["rows"]:
        tds = []
        for c in cols:
            cell = row["cells"][c]
            s = cell["state"]
            _, bg, fg = STATES[s]
            body = e(cell_text(cell, detail=False))
            if s == "fail":
                body += f"<br>reproduce: <code>{e(cell['reproducer'])}</code>"
            elif cell.get("reason") and s in ("partial", "unsupported", "not_run"):
                body += f"<br><small>{e(cell['reason'])}</small>"
            elif s == "known":
                body += f"<br><small>{e(cell['known_reason'])}</small>"
            tds.append(f'<td class="cell state-{s}" style="background:{bg};color:{fg}">{body}</td>')
        parts.append(
            f'<tr><td class="group">{e(row["group"])}</td>'
            f'<td title="{e(row["rule"])}">{e(row["label"])}</td>' + "".join(tds) + "</tr>"
        )
    parts.append("</table><h2>Runs</h2><ul>")
    parts += [f"<li>{e(line[2:])}</li>" for line in _runs_lines(matrix)]
    parts.append("</ul></body></html>")
    return "\n".join(parts)


def caption(matrix: dict) -> str:
    """What the runs have in common, for the picture: machine, torch, the selection."""
    runs = list(matrix["runs"].values())
    if not runs:
        return "no runs"

    def common(get):
        values = {json.dumps(get(r), sort_keys=True) for r in runs}
        return get(runs[0]) if len(values) == 1 else None

    parts = []
    for label, get in (("machine", lambda r: r["machine_class"]), ("torch", lambda r: r["torch"]),
                       ("-m", lambda r: r["selection"].get("markexpr")),
                       ("-k", lambda r: r["selection"].get("keyword"))):  # fmt: skip
        value = common(get)
        if value:
            parts.append(f"{label} {value!r}" if label.startswith("-") else f"{label} {value}")
    return (
        f"One run per implementation ({', '.join(parts) or 'different settings'}). "
        "n/s: not supported. Reasons and reproducers: matrix.md, matrix.html."
    )


def render_png(matrix: dict) -> bytes | None:
    """The table as a PNG (matplotlib, Agg), tagged with the matrix's digest; None without
    matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        return None
    from te_conformance.reports.browser import tag_png

    cols, rows = matrix["columns"], matrix["rows"]
    label_w, col_w, row_h, head_h = 3.1, 1.55, 0.26, 0.45
    width = label_w + col_w * len(cols) + 0.2
    height = head_h + row_h * len(rows) + 0.75
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    for j, name in enumerate(cols):
        x = label_w + j * col_w
        ax.text(x + col_w / 2, head_h / 2, name, ha="center", va="center", fontsize=8.5,
                weight="bold")  # fmt: skip
    group = None
    for i, row in enumerate(rows):
        y = head_h + i * row_h
        if row["group"] != group:
            group = row["group"]
            ax.plot([0.05, width - 0.1], [y, y], color="#888", lw=0.8)
            ax.text(0.08, y + row_h / 2, group, va="center", fontsize=6.5, color="#666")
        ax.text(1.05, y + row_h / 2, row["label"], va="center", fontsize=7)
        for j, name in enumerate(cols):
            cell = row["cells"][name]
            _, bg, fg = STATES[cell["state"]]
            x = label_w + j * col_w
            ax.add_patch(Rectangle((x + 0.02, y + 0.02), col_w - 0.04, row_h - 0.04,
                                   facecolor=bg, edgecolor="#999", lw=0.5))  # fmt: skip
            ax.text(x + col_w / 2, y + row_h / 2, short_text(cell), ha="center", va="center",
                    fontsize=6.5, color=fg)  # fmt: skip
    handles = [Patch(facecolor=bg, edgecolor="#999", label=label)
               for label, bg, _ in STATES.values()]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=6.5, frameon=False,
               bbox_to_anchor=(0.5, 0.25 / height))  # fmt: skip
    ax.text(width / 2, height - 0.12, caption(matrix), ha="center", va="bottom", fontsize=5.5,
            color="#555", wrap=True)  # fmt: skip
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, metadata={"Software": None})
    return tag_png(buf.getvalue(), {"matrix_sha256": digest(matrix), "columns": cols}, PNG_KEY)


def png_digest(png: bytes) -> str | None:
    """The matrix digest a matrix.png records (None: not a matrix picture)."""
    from te_conformance.reports.browser import png_tag

    info = png_tag(png, PNG_KEY)
    return info.get("matrix_sha256") if isinstance(info, dict) else None


def feature_table_markdown(catalogue: list[dict]) -> str:
    """A feature catalogue in Markdown (docs/reports.md holds the suites'; a test keeps the two
    equal)."""
    lines = ["| group | feature | the cases it counts |", "|---|---|---|"]
    lines += [f"| {f['group']} | {_md(f['label'])} | {_md(f['rule'])} |" for f in catalogue]
    return "\n".join(lines) + "\n"


def write(matrix: dict, out: Path) -> list[Path]:
    """matrix.json, .md, .html and .png (when matplotlib is there) into out; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("matrix.json", matrix_json(matrix)),
                       ("matrix.md", render_markdown(matrix)),
                       ("matrix.html", render_html(matrix))):  # fmt: skip
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    png = render_png(matrix)
    if png is not None:
        (out / "matrix.png").write_bytes(png)
        written.append(out / "matrix.png")
    return written
