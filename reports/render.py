"""Render a report as report.md and a self-contained report.html (tables and plots)."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
import shlex
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from te_conformance.reports.model import (
    FAILING,
    OUTCOMES,
    bucket,
    field,
    fmt_num,
    fmt_ratio,
    interrupted,
    ratio_of,
    to_float,
    worst_ratio,
    worst_tensor,
)

WORST_N = 20
TRACEBACKS_N = 50  # failures beyond this show only their message
COUNTER_KEYS = ("graph_breaks", "cudagraph_skips", "recompiles")
HIST_FLOOR = -6.0


@dataclass
class Table:
    """A titled table with an optional note; rendered to Markdown or HTML."""

    title: str
    header: list[str]
    rows: list[list]
    note: str = ""


def short_name(nodeid: str) -> str:
    """The test's name with its parameters: 'suites/x.py::T::test_fwd[bf16]' -> 'test_fwd[bf16]'."""
    return nodeid.rsplit("::", 1)[-1]


def outcome_counts(summary: dict) -> str:
    """'1 failed, 4 passed, ...' in a fixed order, zeros left out."""
    parts = [f"{summary.get(o, 0)} {o}" for o in OUTCOMES if summary.get(o)]
    return ", ".join(parts) or "no cases"


def on_gpu(case: dict) -> bool:
    """Whether the case ran on a CUDA device (its recorded device field)."""
    return field(case, "device").startswith("cuda")


def worst_case(report: dict) -> tuple[dict | None, bool]:
    """(the case with the largest ratio, whether it was chosen among GPU cases only).

    A GPU run also runs the CPU cases; its headline is about the GPU, so when any GPU case
    compared a tensor, the worst ratio is taken over the GPU cases alone.
    """
    rated = [c for c in report["cases"] if worst_ratio(c) is not None]
    gpu = [c for c in rated if on_gpu(c)]
    pool = gpu or rated
    return (max(pool, key=worst_ratio) if pool else None), bool(gpu)


def summary_line(report: dict) -> str:
    """Counts, wall time and the worst ratio (of the GPU cases in a GPU run) in one line."""
    s = report["summary"]
    failed = sum(s.get(o, 0) for o in FAILING)
    dur = to_float(s.get("duration_s"))
    worst = ""
    case, gpu_only = worst_case(report)
    if case:
        t = worst_tensor(case)
        worst = (
            f"; worst {'GPU ' if gpu_only else ''}ratio {fmt_ratio(to_float(t.get('ratio')))} "
            f"({short_name(case['nodeid'])}, {t.get('name', '?')})"
        )
    took = f" in {dur:.1f} s" if dur is not None else ""
    state = "FAIL" if failed else "PASS"
    if stopped := interrupted(report):  # a partial report passes nothing
        collected = f", {s['collected']} collected" if s.get("collected") is not None else ""
        state = f"{'FAIL, ' if failed else ''}INCOMPLETE (stopped by {stopped}{collected})"
    return (
        f"Tests {state}: {outcome_counts(s)} "
        f"of {s.get('total', len(report['cases']))} cases{took}{worst}"
    )


def verdict_of(report: dict) -> dict | None:
    """The release verdict stored by `python -m te_conformance run` (None for a bare plugin
    report)."""
    v = report.get("verdict")
    return v if isinstance(v, dict) and v.get("status") else None


def banner(report: dict) -> tuple[str, str]:
    """(status, text) of the page's banner: the stored verdict with its reasons, else what the
    test outcomes alone say (FAIL with a failing case or a partial report)."""
    v = verdict_of(report)
    if v is None:
        failed = any(c["outcome"] in FAILING for c in report["cases"])
        return ("FAIL" if failed or interrupted(report) else "PASS"), summary_line(report)
    why = [*(v.get("reasons") or []), *(v.get("notes") or [])]
    return v["status"], f"Verdict: {v['status']}" + (f" — {'; '.join(why)}" if why else "")


def skip_kind(case: dict) -> str:
    """A skipped case's recorded kind (reports.record.skip), "xfail" for an xfailed one."""
    if case["outcome"] == "xfailed":
        return "xfail"
    return (case.get("skip") or {}).get("kind") or "unrecorded"


def skip_text(case: dict) -> str:
    """A skipped or xfailed case's reasons as one group: the recorded reasons (skip.reasons), each
    once and sorted, so the same reasons in another order are one row; else its reason text."""
    found = (case.get("skip") or {}).get("reasons") or []
    texts = sorted({str(r.get("text")) for r in found if isinstance(r, dict) and r.get("text")})
    if texts and case["outcome"] != "xfailed":
        return "; ".join(texts)
    return (case.get("skip_reason") or "-").strip().removeprefix("reason: ").strip() or "-"


def te_deviations_of(case: dict) -> list[dict]:
    """[{id, title, where, reproducer}] of the TE deviations (source "te_deviation" of the
    case's ``expected`` records) that explain an xfailed case; empty for any other case."""
    if case["outcome"] != "xfailed":
        return []
    found = []
    for e in case.get("expected") or []:
        if e.get("source") == "te_deviation":
            found.append({"id": str(e.get("id") or "-"), "title": e.get("title") or e.get("reason")
                          or "-", "where": e.get("where") or "-",
                          "reproducer": e.get("reproducer") or "-"})  # fmt: skip
    return found


def te_deviation(case: dict) -> dict | None:
    """The first TE deviation that explains an xfailed case, or None."""
    found = te_deviations_of(case)
    return found[0] if found else None


def te_deviation_rows(report: dict) -> list[list]:
    """[id, title, TE source, cases, reproducer], one row per deviation (or fallback kind)."""
    groups: dict[tuple[str, str], dict] = {}
    for c in report["cases"]:
        for d in te_deviations_of(c):
            g = groups.setdefault((d["id"], ""), {**d, "cases": 0})
            g["cases"] += 1

    def order(key):  # D1, D2, ..., D10 in number order, then other ids; fallbacks last
        n = re.search(r"\d+", key[0])
        return (key[0] == "fallback", not key[0].startswith("D"), int(n[0]) if n else 0, key)

    return [
        [g["id"], g["title"], g["where"], g["cases"], g["reproducer"]]
        for g in (groups[k] for k in sorted(groups, key=order))
    ]


def _environment_rows(env: dict) -> list[list]:
    gpus = Counter(f"{g.get('name')} (driver {g.get('driver')})" for g in env.get("gpus") or [])
    rows = [
        ["machine class", env.get("machine_class")],
        ["GPUs", ", ".join(f"{n} x {g}" for g, n in gpus.items()) or "none (CPU)"],
        ["torch", f"{env.get('torch') or '-'} (CUDA {env.get('torch_cuda') or '-'})"],
        ["python", env.get("python")],
        ["platform", env.get("platform")],
        ["hostname", env.get("hostname")],
        ["judged", ", ".join(f"{n} ({v or 'version unknown'})" for n, v in
                             (env.get("impl_versions") or {}).items()) or "-"],
        ["fingerprint", fingerprint_text(env.get("fingerprint"))],
        ["git commit", env.get("git_commit") or "-"],
        ["date (UTC)", env.get("date_utc")],
        ["pytest args", " ".join(env.get("pytest_args") or [])],
        ["shard", env.get("shard") or "-"],
    ]
    for s in env.get("shards") or []:
        rows.append(
            [
                f"merged shard {s.get('shard') or '-'}",
                f"{s.get('source')}: {s.get('cases')} cases on {s.get('hostname')}, "
                f"{s.get('date_utc')}",
            ]
        )
    return [[k, "-" if v is None else v] for k, v in rows]


def fingerprint_text(fp: dict | None) -> str:
    """A machine fingerprint (reports.env.fingerprint) in one line: 'AMD EPYC AVX2, torch
    2.13.0+cpu' (+ the ISA variables, GPUs and CUDA where there are)."""
    if not fp:
        return "none recorded"
    parts = [f"{fp.get('cpu') or '?'} {fp.get('cpu_capability') or '?'}"]
    parts += [f"{k}={v}" for k, v in (fp.get("isa_variables") or {}).items()]
    parts += list(fp.get("gpus") or [])
    cuda = f" CUDA {fp['torch_cuda']}" if fp.get("torch_cuda") else ""
    threads = fp.get("torch_threads")
    if threads is not None:
        parts.append(f"{threads} torch thread(s) a test process")
    return ", ".join([*parts, f"torch {fp.get('torch')}{cuda}"])


def adapter_counts(report: dict) -> list[tuple[str, dict]]:
    """[(adapter, outcome counts)] of the cases each adapter's tests judged (the tests that take
    an ``adapter``), then ("not an adapter's", counts) for the other tests (te_fast's own ops,
    te_ref's and the checks' self-tests), which judge no adapter."""
    groups: dict[str, Counter] = defaultdict(Counter)
    for c in report["cases"]:
        groups[c.get("adapter") or ""][c["outcome"]] += 1
    named = sorted(k for k in groups if k)
    return [(k, dict(groups[k])) for k in named] + (
        [("not an adapter's", dict(groups[""]))] if "" in groups else []
    )


def expected_rows(report: dict) -> list[list]:
    """[adapter, source, tensors, reason, cases, outcomes, defined at], one row per expected
    outcome the suites applied (known failures, declared differences, TE deviations: each
    case's ``expected`` records, as the suites' expected outcomes record them)."""
    groups: dict[tuple, Counter] = defaultdict(Counter)
    for c in report["cases"]:
        for e in c.get("expected") or []:
            key = (e.get("adapter") or c.get("adapter") or "-", e.get("source") or "-",
                   ", ".join(e.get("tensors") or []) or "-", e.get("reason") or "-",
                   e.get("defined_at") or "-")  # fmt: skip
            groups[key][c["outcome"]] += 1
    return [[a, src, t, reason, sum(n.values()), outcome_counts(n), where]
            for (a, src, t, reason, where), n in sorted(groups.items())]  # fmt: skip


def _grouped(cases: list[dict], key) -> list[list]:
    """Rows of [*key, cases, pass, fail, skip, worst ratio] grouped by key(case)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for c in cases:
        groups[key(c)].append(c)
    rows = []
    for k in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
        members = groups[k]
        n = Counter(bucket(c["outcome"]) for c in members)
        rated = [c for c in members if worst_ratio(c) is not None]
        worst = worst_tensor(max(rated, key=worst_ratio)) if rated else {}
        rows.append(
            [
                *k,
                len(members),
                n["pass"],
                n["fail"],
                n["skip"],
                fmt_ratio(to_float(worst.get("ratio"))),
            ]
        )
    return rows


def tables(report: dict) -> list[Table]:
    """Every table of the report, in order; empty sections are left out."""
    cases = report["cases"]
    out = [Table("Environment", ["", ""], _environment_rows(report["environment"]))]
    by_adapter = adapter_counts(report)
    if any(name != "not an adapter's" for name, _ in by_adapter):
        out.append(Table(
            "Cases by adapter", ["adapter", *OUTCOMES, "total"],
            [[name, *(n.get(o, 0) for o in OUTCOMES), sum(n.values())] for name, n in by_adapter],
            "an adapter's cases are those of the tests that take it (the conformance suites); "
            "the rest judge no adapter and are counted apart",
        ))  # fmt: skip
    expected = expected_rows(report)
    if expected:
        out.append(Table(
            "Expected differences", ["adapter", "source", "tensors", "reason", "cases",
                                     "outcomes", "defined at"], expected,
            "strict expected failures: each must fail on its tensors and nothing else "
            "(xfailed); a case that passes or fails otherwise is a failure",
        ))  # fmt: skip
    counts = ["cases", "pass", "fail", "skip", "worst ratio"]
    out.append(
        Table(
            "Results by layout x dtype x impl",
            ["layout", "dtype", "impl", *counts],
            _grouped(cases, lambda c: (field(c, "layout"), field(c, "dtype"), field(c, "impl"))),
            "ratio = max_abs_err / bound per compared tensor; <= 1 passes. "
            "fail counts failed + error, skip counts skipped + xfailed.",
        )
    )
    rated = sorted(
        (c for c in cases if worst_ratio(c) is not None),
        key=lambda c: (-worst_ratio(c), c["nodeid"]),
    )
    worst_rows = []
    for i, c in enumerate(rated[:WORST_N], 1):
        t = worst_tensor(c)
        worst_rows.append(
            [
                i,
                short_name(c["nodeid"]),
                field(c, "impl"),
                t.get("name", "?"),
                fmt_num(t.get("max_abs_err")),
                fmt_num(t.get("bound")),
                fmt_ratio(to_float(t.get("ratio"))),
                worst_at(c, t) or "-",
                c["outcome"],
            ]
        )
    if worst_rows:
        out.append(
            Table(
                f"Worst {len(worst_rows)} cases by ratio",
                [
                    "#",
                    "case",
                    "impl",
                    "tensor",
                    "max_abs_err",
                    "bound",
                    "ratio",
                    "worst at",
                    "outcome",
                ],  # fmt: skip
                worst_rows,
            )
        )
    deviations = te_deviation_rows(report)
    if deviations:
        explained = sum(1 for c in report["cases"] if te_deviations_of(c))  # a case once
        out.append(
            Table(
                "TE deviations",
                ["deviation", "title", "TE source", "cases", "reproducer"],
                deviations,
                f"{explained} xfailed case(s) explained by a documented Transformer Engine "
                "deviation or a classified TE fallback (suites/te_deviations).",
            )
        )
    reasons = Counter(
        (skip_kind(c), skip_text(c))
        for c in cases
        if c["outcome"] in ("skipped", "xfailed") and te_deviation(c) is None
    )
    if reasons:
        rows = sorted(([k, r, n] for (k, r), n in reasons.items()),
                      key=lambda row: (-row[2], row[0], row[1]))  # fmt: skip
        out.append(
            Table(
                "Skip reasons",
                ["kind", "reason", "cases"],
                rows,
                "one row per kind and distinct reasons: declined (the implementation's adapter "
                "turns the case away), environment (this machine lacks a device, a package or a "
                "build), inexpressible (no such combination), unrecorded (a skip no suite "
                "classified), xfail (an expected difference)"
                + ("; TE deviations are in their own section" if deviations else ""),
            )
        )
    compiled = [
        c for c in cases if any(to_float((c.get("counters") or {}).get(k)) for k in COUNTER_KEYS)
    ]
    if compiled:
        out.append(
            Table(
                "Cases with graph breaks, cudagraph skips or recompiles",
                ["case", "impl", *COUNTER_KEYS],
                [
                    [
                        short_name(c["nodeid"]),
                        field(c, "impl"),
                        *[(c.get("counters") or {}).get(k, 0) for k in COUNTER_KEYS],
                    ]
                    for c in compiled
                ],
            )
        )
    if any(c.get("cuda_visible_devices") is not None for c in cases):
        out.append(
            Table(
                "Cases per GPU (CUDA_VISIBLE_DEVICES)",
                ["GPU", *counts],
                _grouped(cases, lambda c: (c.get("cuda_visible_devices") or "-",)),
            )
        )
    if any(c.get("worker") for c in cases):
        out.append(
            Table(
                "Cases per worker",
                ["worker", *counts],
                _grouped(cases, lambda c: (c.get("worker") or "-",)),
            )
        )
    return out


def _axes_of(fmt: str) -> list[str]:
    """Axis names of one tensor format: 'bs3hd' -> b, s, h, d (the packing digit dropped)."""
    return [a for a in fmt if a.isalpha()]


def axis_names(case: dict, tensor: dict, ndim: int) -> list[str] | None:
    """Names of a compared tensor's axes from the case's layout ('bshd_bs2hd', 'thd_t2hd',
    'op:scaled_softmax'), or None where the layout does not say (then the index stays bare)."""
    layout, name = field(case, "layout"), str(tensor.get("name", ""))
    if layout.startswith("op:"):  # softmax ops: [b, h, s_q, s_k], or [b*h, s_q, s_k]
        return {4: ["b", "h", "s_q", "s_k"], 3: ["bh", "s_q", "s_k"]}.get(ndim)
    if name in ("max_logit", "dsoftmax_offset") and ndim == 1:
        return ["h"]
    if name == "dbias" and ndim == 4:
        return ["b", "h", "s_q", "s_k"]
    if layout == "-" or not re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", layout):
        return None
    parts = layout.split("_")
    part = {"out": 0, "dq": 0, "dk": 1, "dv": 2}.get(name)
    if part is None:
        return None
    axes = _axes_of(parts[min(part, len(parts) - 1)])
    if name == "out" and ndim == len(axes) - 1 and axes[-2:] == ["h", "d"]:
        axes = [*axes[:-2], "hd"]  # the output's heads and head dim flattened: [b, s, h*d]
    return axes if len(axes) == ndim else None


def worst_at(case: dict, tensor: dict | None) -> str | None:
    """The worst element of a compared tensor with named axes ('b=0, s=1, h=0, d=3'), bare
    ('[0, 1]') where the layout names none; None without a recorded index."""
    index = (tensor or {}).get("worst_index")
    if not isinstance(index, list) or not index:
        return None
    names = axis_names(case, tensor, len(index))
    if names is None:
        return "[" + ", ".join(map(str, index)) + "]"
    return ", ".join(f"{a}={i}" for a, i in zip(names, index))


def _target(nodeid: str, environment: dict | None) -> list[str]:
    """How pytest names the case from the directory the run started in: its node id where the
    run started in its rootdir; else (an installed package's tests, run from elsewhere) the
    node id as a --pyargs module path under the package the rootdir is (environment
    ``rootdir_package``: 'suites/test_x.py::t[a]' in 'te_conformance' -> --pyargs
    'te_conformance.suites.test_x::t[a]'), or, where the rootdir is no package or the path no
    module path, the file's absolute path."""
    env = environment or {}
    started, root = env.get("started_in"), env.get("rootdir")
    if not started or not root or Path(started) == Path(root):
        return [nodeid]
    path, sep, rest = nodeid.partition("::")
    package = env.get("rootdir_package")
    if package and path.endswith(".py") and not path.startswith(("..", "/")):
        return ["--pyargs", f"{package}.{path[:-3].replace('/', '.')}{sep}{rest}"]
    return [str(Path(root, path)) + sep + rest]


def reproducer(case: dict, pytest_args: list[str] | None = None,
               environment: dict | None = None) -> str:  # fmt: skip
    """One line that reproduces a failing case: the command its test recorded (``reproducer``:
    a fuzz check's shrunk example), else pytest on the case (with the run's --impl adapters),
    named so that it runs from the directory the run started in (_target)."""
    if case.get("reproducer"):
        return str(case["reproducer"])
    impls = []
    args = list(pytest_args or [])
    for i, a in enumerate(args):
        if a == "--impl" and i + 1 < len(args):
            impls += ["--impl", args[i + 1]]
        elif a.startswith("--impl="):
            impls.append(a)
    target = _target(case["nodeid"], environment)
    return shlex.join(["python", "-m", "pytest", "-p", "no:xdist", *impls, *target])


@dataclass
class Failure:
    """One failing case as both renderers show it."""

    nodeid: str
    outcome: str
    message: str  # stripped, at most 1000 characters, "-" when there is none
    traceback: str | None  # the longrepr less the message's lines, for the first TRACEBACKS_N
    reproducer: str = ""  # one line that runs the case again
    worst: str = ""  # the worst tensor with its ratio and named worst element, when compared


def _without_message(traceback: str | None, message: str) -> str | None:
    """The traceback less its lines that repeat the message (pytest's 'E   ...' lines): the
    failure text is shown once."""
    if not traceback:
        return None
    said = {ln.strip() for ln in message.splitlines() if ln.strip()}
    kept = []
    for line in traceback.splitlines():
        body = line[1:].strip() if line.startswith("E ") else None
        if body is not None and (body in said or any(body and body in s for s in said)):
            continue
        kept.append(line)
    text = "\n".join(kept).strip("\n")
    return text or None


def failure_entries(report: dict) -> list[Failure]:
    """The failed and errored cases in report order."""
    fails = [c for c in report["cases"] if c["outcome"] in FAILING]
    args = report["environment"].get("pytest_args") or []
    entries = []
    for i, c in enumerate(fails):
        message = (c.get("message") or "-").strip()
        t = worst_tensor(c)
        worst = ""
        if t is not None:
            at = worst_at(c, t)
            worst = (f"worst tensor {t.get('name', '?')}: ratio {fmt_ratio(ratio_of(t))}"
                     + (f" at {at}" if at else ""))  # fmt: skip
        entries.append(
            Failure(
                nodeid=c["nodeid"],
                outcome=c["outcome"],
                message=message[:1000],
                traceback=None
                if i >= TRACEBACKS_N
                else _without_message(c.get("longrepr"), message),
                reproducer=reproducer(c, args, report["environment"]),
                worst=worst,
            )
        )
    return entries


def _tail(text: str, lines: int = 30, chars: int = 2000) -> str:
    """The end of a traceback, where the assertion is."""
    text = text.strip("\n")
    kept = "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]
    return kept if kept == text.rstrip() else "...\n" + kept


# ---------------------------------------------------------------- markdown


def _md_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _md_table(t: Table) -> list[str]:
    lines = [f"## {t.title}", ""]
    if t.note:
        lines += [t.note, ""]
    lines.append("| " + " | ".join(map(_md_cell, t.header)) + " |")
    lines.append("|" + "|".join("---" for _ in t.header) + "|")
    lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in t.rows]
    return lines + [""]


def render_markdown(
    report: dict, comparison: str | None = None, mutation: dict | None = None
) -> str:
    """report.md: environment, summary, tables, the mutation kill matrix if given, failures,
    and the baseline comparison if given."""
    status, text = banner(report)
    lines = ["# TE conformance report", ""]
    if verdict_of(report):
        lines += [f"**{text}**", ""]
    lines += [f"**{summary_line(report)}**", ""]
    if comparison:
        lines += ["## Comparison with the baseline", "", "```", comparison, "```", ""]
    for t in tables(report) + (mutation_tables(mutation) if mutation else []):
        lines += _md_table(t)
    fails = failure_entries(report)
    if fails:
        lines += [f"## Failures ({len(fails)})", ""]
        for f in fails:
            lines += [f"### `{f.nodeid}` ({f.outcome})", "", "```", f.message, "```", ""]
            lines.append(f"reproduce: `{f.reproducer}`")
            if f.worst:
                lines += ["", f.worst]
            if f.traceback:
                lines += [
                    "",
                    "<details><summary>traceback</summary>",
                    "",
                    "```",
                    _tail(f.traceback),  # the end, where the assertion is
                    "```",
                    "",
                    "</details>",
                ]
            lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- plots


def _png(fig) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def heatmap_cells(report: dict) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], int]]:
    """({(layout, dtype): worst ratio}, {(layout, dtype): failing cases}). A cell with a failing
    case is drawn red above the pass line whatever its ratios: a failure without a ratio (a
    semantics check, an exception) must not leave its cell green or blank."""
    worst: dict[tuple[str, str], float] = {}
    failed: Counter = Counter()
    for c in report["cases"]:
        k = (field(c, "layout"), field(c, "dtype"))
        r = worst_ratio(c)
        if c["outcome"] in FAILING:
            failed[k] += 1
            r = math.inf if r is None or r <= 1 else r
        if r is not None:
            worst[k] = max(worst.get(k, r), r)
    return worst, dict(failed)


def _heatmap(report: dict):
    import numpy as np
    from matplotlib.colors import ListedColormap, TwoSlopeNorm
    from matplotlib.figure import Figure

    worst, failed = heatmap_cells(report)
    if not worst:
        return None
    layouts = sorted({k[0] for k in worst})
    dtypes = sorted({k[1] for k in worst})
    values = np.full((len(layouts), len(dtypes)), np.nan)
    for (lay, dt), r in worst.items():
        values[layouts.index(lay), dtypes.index(dt)] = r
    finite = values[np.isfinite(values) & (values > 0)]
    lo = max(-6.0, min(-3.0, math.floor(np.log10(finite.min())))) if finite.size else -3.0
    hi = max(1.0, math.ceil(np.log10(finite.max()))) if finite.size else 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.clip(np.log10(values), lo, hi)  # 0 -> lo, inf -> hi; nan stays nan (grey)
    # Two colour families that meet abruptly at ratio 1, so the pass line stands out.
    from matplotlib import colormaps

    colours = np.vstack(
        [
            colormaps["YlGn_r"](np.linspace(0.0, 0.85, 128)),
            colormaps["Reds"](np.linspace(0.45, 1.0, 128)),
        ]
    )
    cmap = ListedColormap(colours).with_extremes(bad="#dddddd")
    fig = Figure(figsize=(2.2 + 1.1 * len(dtypes), 1.4 + 0.45 * len(layouts)))
    ax = fig.add_subplot()
    im = ax.imshow(logs, cmap=cmap, norm=TwoSlopeNorm(0.0, lo, hi), aspect="auto")
    ax.set_xticks(range(len(dtypes)), dtypes)
    ax.set_yticks(range(len(layouts)), layouts)
    ax.set_title("worst ratio by layout x dtype (all impls); a cell with a failure is red")
    for i in range(len(layouts)):
        for j in range(len(dtypes)):
            v = values[i, j]
            colour = (
                "white"
                if np.isfinite(logs[i, j]) and (logs[i, j] > 0.3 * hi or logs[i, j] < 0.7 * lo)
                else "black"
            )
            n_failed = failed.get((layouts[i], dtypes[j]), 0)
            label = "-" if np.isnan(v) else fmt_ratio(v) if v != math.inf or not n_failed else ""
            if n_failed:  # a failing cell says so, whatever its ratios
                label = f"{label}\n{n_failed} FAILED".strip()
            ax.text(
                j,
                i,
                label,
                ha="center",
                va="center",
                fontsize=9,
                color=colour,
            )
    ticks = list(range(int(lo), int(hi) + 1))
    bar = fig.colorbar(im, ax=ax, ticks=ticks)
    bar.ax.set_yticklabels([("1 = pass line" if t == 0 else f"{10.0**t:g}") for t in ticks])
    bar.ax.axhline(0.0, color="black", linewidth=2)
    return fig


def _histogram(report: dict):
    import numpy as np
    from matplotlib.figure import Figure

    ratios = [ratio_of(t) for c in report["cases"] for t in c.get("tensors") or []]
    ratios = [r for r in ratios if r is not None]
    logs = np.log10([r for r in ratios if 0 < r < math.inf])
    if not logs.size:
        return None
    # A few vanishing ratios (1e-200) would squeeze everything that matters into one bar.
    tiny = int((logs < HIST_FLOOR).sum())
    logs = np.maximum(logs, HIST_FLOOR)
    zeros = sum(r == 0 for r in ratios)
    infs = sum(r == math.inf for r in ratios)
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    ax.hist(logs, bins=40, color="#4c72b0")
    ax.axvline(0.0, color="#c44e52", linewidth=2, label="ratio = 1 (pass line)")
    ax.set_xlabel("log10(ratio)   (ratio = max_abs_err / bound)")
    ax.set_ylabel("compared tensors")
    ax.yaxis.get_major_locator().set_params(integer=True)
    notes = [
        f"{n} {what} not shown" for n, what in ((zeros, "exact zeros"), (infs, "inf/nan")) if n
    ]
    if tiny:
        notes.append(f"{tiny} below 1e{HIST_FLOOR:.0f} drawn at {HIST_FLOOR:.0f}")
    extra = ", ".join(notes)
    ax.set_title(f"{len(ratios)} compared tensors" + (f" ({extra})" if extra else ""))
    ax.legend()
    return fig


def _counters_bar(report: dict):
    from matplotlib.figure import Figure

    totals: Counter = Counter()
    for c in report["cases"]:
        for k, v in (c.get("counters") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                totals[k] += v
    if not totals:
        return None
    names = sorted(totals)
    fig = Figure(figsize=(7, 0.6 + 0.4 * len(names)))
    ax = fig.add_subplot()
    bars = ax.barh(names, [totals[n] for n in names], color="#55a868")
    ax.bar_label(bars, padding=3)
    ax.invert_yaxis()
    ax.set_title("compile counters, summed over all cases")
    return fig


def plots(report: dict) -> tuple[list[tuple[str, str]], list[str]]:
    """([(title, base64 png)], [notes]); never raises: a plot that fails becomes a note."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return [], ["plots unavailable: matplotlib not installed"]
    images, notes = [], []
    for title, make in (
        ("Worst ratio by layout x dtype", _heatmap),
        ("Distribution of ratios", _histogram),
        ("Compile counters", _counters_bar),
    ):
        try:
            fig = make(report)
            if fig is not None:
                images.append((title, _png(fig)))
        except Exception as e:  # a broken plot must not cost the report
            notes.append(f"plot '{title}' unavailable: {type(e).__name__}: {e}")
    return images, notes


# ---------------------------------------------------------------- html

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } tr:nth-child(even) td { background: #fafafa; }
.verdict { font-size: 1.2em; font-weight: bold; padding: 0.4em 0.8em; display: inline-block; }
.PASS { background: #d8f0d8; } .FAIL { background: #f6d0d0; color: #7a0000; }
.NO-BASELINE { background: #fff0c0; }
.note { color: #666; } .warn { color: #a33; font-weight: bold; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em 0; }
"""


def _html_table(t: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in t.header)
    head = f"<tr>{head}</tr>" if any(t.header) else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in row) + "</tr>" for row in t.rows
    )
    note = f'<p class="note">{e(t.note)}</p>' if t.note else ""
    return f"<h2>{e(t.title)}</h2>{note}<table>{head}{body}</table>"


def render_html(report: dict, comparison: str | None = None, mutation: dict | None = None) -> str:
    """One self-contained HTML page: inline CSS, plots as data: URIs, nothing fetched."""
    e = html.escape
    status, text = banner(report)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>TE conformance report</title><style>{CSS}</style></head><body>",
        "<h1>TE conformance report</h1>",
        f'<p class="verdict {status.replace(" ", "-")}">{e(text)}</p>',
    ]
    if verdict_of(report):
        parts.append(f'<p class="headline">{e(summary_line(report))}</p>')
    if comparison:
        parts.append(f"<h2>Comparison with the baseline</h2><pre>{e(comparison)}</pre>")
    images, notes = plots(report)
    all_tables = tables(report)
    parts += [_html_table(t) for t in all_tables[:2]]  # environment, results by layout
    parts.append("<h2>Plots</h2>")
    parts += [f'<p class="warn">{e(n)}</p>' for n in notes]
    parts += [f'<img alt="{e(title)}" src="data:image/png;base64,{png}">' for title, png in images]
    parts += [_html_table(t) for t in all_tables[2:]]
    parts += [_html_table(t) for t in (mutation_tables(mutation) if mutation else [])]
    fails = failure_entries(report)
    if fails:
        parts.append(f"<h2>Failures ({len(fails)})</h2>")
        for f in fails:
            parts.append(f"<h3>{e(f.nodeid)} ({e(f.outcome)})</h3><pre>{e(f.message)}</pre>")
            parts.append(f'<p class="repro">reproduce: <code>{e(f.reproducer)}</code></p>')
            if f.worst:
                parts.append(f"<p>{e(f.worst)}</p>")
            if f.traceback:
                parts.append(
                    f"<details><summary>traceback</summary><pre>{e(f.traceback)}</pre></details>"
                )
    parts.append("</body></html>")
    return "\n".join(parts)


def render(report: dict, out_dir: str | Path, comparison: str | None = None) -> tuple[Path, Path]:
    """Write report.md and report.html into out_dir; returns their paths. A mutation kill matrix
    (MUTATION_FILE, from python -m tools.mutation) in out_dir joins both."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mutation = load_mutation(out / MUTATION_FILE)
    md, page = out / "report.md", out / "report.html"
    md.write_text(render_markdown(report, comparison, mutation), encoding="utf-8")
    page.write_text(render_html(report, comparison, mutation), encoding="utf-8")
    return md, page


# ---------------------------------------------------------------- mutation kill matrix

MUTATION_FILE = "mutation.json"


def load_mutation(path: Path) -> dict | None:
    """The kill matrix at path, or None when there is none (or it cannot be read)."""
    try:
        matrix = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return matrix if isinstance(matrix, dict) and "results" in matrix else None


def mutation_tables(matrix: dict) -> list[Table]:
    """The kill matrix of python -m tools.mutation: one row per planted defect, with the test
    that caught it, or why it survived, errored or did not run."""
    env = matrix.get("environment") or {}
    counts = ", ".join(f"{n} {r}" for r, n in (matrix.get("counts") or {}).items() if n)
    commit = (env.get("commit") or "-")[:12] + (
        " (uncommitted changes)" if env.get("dirty") else ""
    )
    lines = [
        *([matrix["partial"].upper()] if matrix.get("partial") else []),
        f"{counts or 'no defects'} in {matrix.get('total_s')} s; exit status "
        f"{matrix.get('exit_status')}; commit {commit}; {matrix.get('created_utc')} UTC",
        *(matrix.get("reasons") or []),
        *(matrix.get("notes") or []),
    ]
    rows = []
    for r in matrix["results"]:
        result = r.get("result", "?")
        if result == "SURVIVED" and r.get("known_gap"):
            result += " (known gap)"
        why = (
            r.get("test") if r.get("result") == "CAUGHT" else r.get("known_gap") or r.get("detail")
        )
        rows.append([r.get("name"), r.get("device"), r.get("path"), r.get("description"), result,
                     why or "", r.get("seconds")])  # fmt: skip
    header = ["defect", "device", "file", "what it breaks", "result", "caught by / why", "s"]
    return [Table("Mutation kill matrix", header, rows, " — ".join(lines))]


def mutation_markdown(matrix: dict) -> str:
    """mutation.md: the kill matrix on its own."""
    return "\n".join(_md_table(mutation_tables(matrix)[0])).rstrip()
