"""python -m te_conformance matrix: the cells from the recorded fields (adapter, features, skip
kinds, expected differences), the outputs, bad input, what a run of the suites records for it,
and the committed picture (docs/matrix.png) against the committed runs (docs/matrix_runs/).

Small hand-made reports; CPU only, a few seconds. The report tool reads what the cases recorded:
nothing here or in reports/ names a test of the suites or parses a message."""

from __future__ import annotations

import builtins
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from te_conformance.reports import matrix as mx
from te_conformance.reports.__main__ import main
from te_conformance.reports.model import build_report, write_report

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# a catalogue of the run's own (the report tool knows no feature of the suites')
CATALOGUE = [
    {"key": "sep", "group": "Layouts", "label": "separate", "rule": "separate tensors"},
    {"key": "packed", "group": "Layouts", "label": "packed", "rule": "one buffer"},
    {"key": "thd", "group": "Layouts", "label": "thd", "rule": "ragged"},
    {"key": "mixed", "group": "Layouts", "label": "mixed", "rule": "two formats"},
    {"key": "cache", "group": "Layouts", "label": "kv cache", "rule": "thd q, bshd kv"},
    {"key": "win", "group": "Windows", "label": "window", "rule": "window_size"},
    {"key": "fp8", "group": "Modes", "label": "FP8", "rule": "the FP8 suite"},
]


def case(nodeid, outcome="passed", adapter="torch.sdpa", features=(), kind=None, reasons=(),
         expected=(), **extra):  # fmt: skip
    """A report case as the suites record it: the adapter it judged, its features, its skip's
    kind and reasons ((text, feature) pairs), its expected differences."""
    c = {"nodeid": nodeid, "outcome": outcome, "fields": {}, "adapter": adapter,
         "features": list(features), "expected": list(expected), **extra}  # fmt: skip
    if kind is not None:
        c["skip"] = {"kind": kind, "reasons": [{"text": t, "feature": f} for t, f in reasons]}
        c["skip_reason"] = "; ".join(t for t, _ in reasons)
    return c


def report(impls, cases, pytest_args=None, catalogue=CATALOGUE):
    env = {"pytest_args": pytest_args or [], "torch": "2.13.0", "machine_class": "cpu"}
    if impls is not None:
        env["impls"] = impls
    if catalogue is not None:
        env["features"] = catalogue
    return build_report(cases, env)


def deviation(title: str) -> dict:
    return {"source": "te_deviation", "id": "D1", "title": title, "reason": "why"}


N = "s/t.py::test_{}"  # node ids: the matrix reads none of their parts

# -------------------------------------------------------------------------------------- cells

SDPA_ARGS = ["-p", "te_conformance.reports.plugin", "--impl", "torch.sdpa", "-m", "not gpu"]


def sdpa_run() -> dict:
    declined = "declined"
    return report(
        ["torch.sdpa"],
        [
            # separate layouts: conformant (two passed)
            case(N.format("a"), features=["sep"]),
            case(N.format("b"), features=["sep"]),
            # packed: one passes, one is not supported
            case(N.format("c"), features=["packed"]),
            case(N.format("d"), "skipped", features=["packed"], kind=declined,
                 reasons=[("torch.sdpa does not support layout 'sb3hd'", "packed")]),
            # thd: two fail, one with the check's own reproducer line
            case(N.format("e"), "failed", features=["thd"],
                 message="AssertionError: out ratio 3.2 > 1", reproducer="python -c 'repro()'"),
            case(N.format("f"), "error", features=["thd"], message="RuntimeError: boom"),
            # mixed formats: a recorded deviation
            case(N.format("g"), "xfailed", features=["mixed"],
                 expected=[deviation("a window side too short")]),
            # kv cache: not supported (two reasons, the one about the row wins)
            *(case(N.format(f"h{i}"), "skipped", features=["cache", "win"], kind=declined,
                   reasons=[("torch.sdpa takes no window_size", "win"),
                            ("torch.sdpa takes no cu_seqlens", "cache")]) for i in range(2)),
            case(N.format("i"), "skipped", features=["cache"], kind="environment",
                 reasons=[("torch.sdpa: no CUDA device", None)]),
            # another implementation's cases in this run: left out
            case(N.format("j"), "failed", adapter="te_fast", features=["fp8"]),
            case(N.format("k"), "failed", adapter=None, features=["sep"]),
        ],
        SDPA_ARGS,
    )  # fmt: skip


def test_cell_states():
    m = mx.build_matrix([("sdpa.json", sdpa_run())])
    cells = {row["key"]: row["cells"]["torch.sdpa"] for row in m["rows"]}
    assert [row["key"] for row in m["rows"]] == [f["key"] for f in CATALOGUE]
    assert cells["sep"] == {
        "state": "pass", "cases": 2, "passed": 2, "failed": 0, "skipped": 0, "xfailed": 0
    }  # fmt: skip
    packed = cells["packed"]
    assert packed["state"] == "partial" and (packed["passed"], packed["skipped"]) == (1, 1)
    assert packed["reason"] == "torch.sdpa does not support layout 'sb3hd'"
    thd = cells["thd"]
    assert thd["state"] == "fail" and (thd["failed"], thd["cases"]) == (2, 2)
    # one reproducer: the first failing case's (node id order), the command its test recorded
    assert thd["nodeid"] == N.format("e") and thd["reproducer"] == "python -c 'repro()'"
    assert cells["mixed"]["state"] == "known"
    assert cells["mixed"]["known_reason"] == "a window side too short"
    cache = cells["cache"]
    assert cache["state"] == "unsupported"
    assert cache["reason"] == "torch.sdpa takes no cu_seqlens"  # the reason about this row
    assert (cache["reason_cases"], cache["reasons"], cache["skipped"]) == (2, 2, 2)
    # a skip of this machine's: not the implementation's refusal, not counted as unsupported
    assert cache["other_skips"] == 1
    assert cells["win"]["reason"] == "torch.sdpa takes no window_size"
    # te_fast's case and a case judging no adapter in this run are not torch.sdpa's
    assert cells["fp8"]["state"] == "not_run" and cells["fp8"]["cases"] == 0
    assert m["runs"]["torch.sdpa"]["cases"] == 10  # a..i: j and k are not its cases


def test_a_feature_a_case_ran_without_counts_as_declined_in_its_row():
    """test_broad's substitutes and max_logit left out: the case passed with what ran, and the
    feature it asked for and the adapter turned away (declined_features) is not supported in
    that row, with the adapter's reason; never a pass there."""
    ran_without = case(N.format("a"), features=["sep"],
                       declined_features=[{"feature": "win", "text": "takes no window_size"}])
    m = mx.build_matrix([("r", report(["torch.sdpa"], [ran_without, case(N.format("b"),
                                                                        features=["win"])]))])
    cells = {row["key"]: row["cells"]["torch.sdpa"] for row in m["rows"]}
    assert cells["sep"]["state"] == "pass" and cells["sep"]["passed"] == 1
    win = cells["win"]
    assert (win["state"], win["passed"], win["skipped"]) == ("partial", 1, 1)
    assert win["reason"] == "takes no window_size"
    small = mx.summarize_run(report(["torch.sdpa"], [ran_without]), "r")
    assert small["cases"][0]["declined_features"] == ran_without["declined_features"]


def test_skips_that_are_not_the_implementations_are_not_run():
    """A combination no implementation takes, a missing device or package: not run, with the
    reason; not "not supported", and no blemish on a conformant cell."""
    r = report(
        ["torch.sdpa"],
        [
            case(N.format("a"), features=["packed"]),
            case(N.format("b"), "skipped", features=["packed"], kind="inexpressible",
                 reasons=[("qkv-packed layouts hold q, k, v in one buffer: no GQA/MQA", None)]),
            case(N.format("c"), "skipped", features=["thd"], kind="environment",
                 reasons=[("no CUDA device", None)]),
        ],
    )  # fmt: skip
    cells = {row["key"]: row["cells"]["torch.sdpa"] for row in mx.build_matrix([("r", r)])["rows"]}
    assert cells["packed"]["state"] == "pass"
    assert (cells["packed"]["skipped"], cells["packed"]["other_skips"]) == (0, 1)
    assert cells["thd"]["state"] == "not_run"
    assert mx.cell_text(cells["thd"]) == "not run (no CUDA device)"


@pytest.mark.parametrize(
    "kind,declined",
    [("declined", True), ("environment", False), ("inexpressible", False), (None, False)],
)
def test_a_skip_is_not_supported_when_its_kind_says_the_adapter_declined_it(kind, declined):
    """The recorded kind decides, never the words: a reason that reads like a refusal but was
    recorded as this machine's is not the implementation's."""
    text = "transformer_engine does not support layout 'thd_thd_thd'"
    skipped = case("x::t", "skipped", kind=kind, reasons=[(text, "thd")])
    assert mx.declined(skipped) is declined


def test_the_main_reason_groups_values_and_prefers_the_rows_feature():
    def skipped(*reasons):
        return case("x::t", "skipped", kind="declined", reasons=reasons)

    cases = [
        skipped(("s has no sliding window", "win"), ("s does not support layout 'thd_thd_thd'",
                                                     "thd")),
        skipped(("s has no sliding window", "win"), ("s does not support layout 't3hd'", "thd")),
        skipped(("s has no sliding window", "win")),
        skipped(("s does not support bias type 'alibi'", "alibi"), ("s has no sliding window",
                                                                    "win")),
    ]  # fmt: skip
    # the most common reason: every case gives it
    assert mx.main_reason(cases) == ("s has no sliding window", 4, 3)
    # the thd row's reason: the layouts, grouped with their values
    text = "s does not support layout 't3hd', 'thd_thd_thd'"
    assert mx.main_reason(cases, "thd") == (text, 2, 3)
    assert mx.main_reason(cases, "alibi") == ("s does not support bias type 'alibi'", 1, 3)
    # an expected difference is its title
    xfail = case("x::t", "xfailed", expected=[deviation("a title")])
    assert mx.main_reason([xfail]) == ("a title", 1, 1)


def test_a_failing_case_shows_its_own_reproducer():
    r = report(["torch.sdpa"], [case(N.format("a"), "failed", features=["thd"],
                                     message="x", reproducer="python -c 'r()'")])  # fmt: skip
    cell = next(row for row in mx.build_matrix([("r", r)])["rows"] if row["key"] == "thd")
    assert cell["cells"]["torch.sdpa"]["reproducer"] == "python -c 'r()'"
    text = mx.cell_text(cell["cells"]["torch.sdpa"])
    assert text == "not conformant (1 of 1 failing); reproduce: python -c 'r()'"


def test_named_columns_without_a_run_are_not_run():
    m = mx.build_matrix([("sdpa.json", sdpa_run())], ["te_fast", "torch.sdpa", "flex"])
    assert m["columns"] == ["te_fast", "torch.sdpa", "flex"]
    for row in m["rows"]:
        for name in ("te_fast", "flex"):
            assert row["cells"][name]["state"] == "not_run"
    assert set(m["runs"]) == {"torch.sdpa"}
    md = mx.render_markdown(m)
    assert "- te_fast: not run" in md
    assert md.count("· not run") >= 2 * len(CATALOGUE)
    assert mx.build_matrix([("sdpa.json", sdpa_run())])["columns"] == ["torch.sdpa"]


def test_one_run_of_two_adapters():
    """A run judging two adapters: each case is its recorded adapter's."""
    r = report(
        ["te_fast", "torch.sdpa"],
        [
            case(N.format("a"), adapter="te_fast", features=["sep"]),
            case(N.format("b"), "failed", features=["sep"]),
            case(N.format("c"), "skipped", features=["win"], kind="declined",
                 reasons=[("torch.sdpa lacks traceable", "win")]),
            case(N.format("d"), adapter="flex_attention", features=["sep"]),
        ],
    )  # fmt: skip
    m = mx.build_matrix([("r", r)])
    sep = next(row["cells"] for row in m["rows"] if row["key"] == "sep")
    assert sep["te_fast"]["state"] == "pass" and sep["torch.sdpa"]["state"] == "fail"
    win = next(row["cells"] for row in m["rows"] if row["key"] == "win")
    assert win["torch.sdpa"]["state"] == "unsupported" and win["te_fast"]["state"] == "not_run"
    # a case of an adapter outside the run belongs to nobody
    assert m["runs"]["te_fast"]["cases"] == 1 and m["runs"]["torch.sdpa"]["cases"] == 2


def test_the_runs_catalogues_make_the_rows():
    """Rows come from the runs: two runs' catalogues merge by key, in order; a feature no
    catalogue names is no row."""
    a = report(["a"], [case(N.format("a"), adapter="a", features=["sep", "unlisted"])],
               catalogue=CATALOGUE[:2])  # fmt: skip
    b = report(["b"], [case(N.format("b"), adapter="b", features=["thd"])],
               catalogue=[CATALOGUE[2], CATALOGUE[0]])  # fmt: skip
    m = mx.build_matrix([("a", a), ("b", b)])
    assert [row["key"] for row in m["rows"]] == ["sep", "packed", "thd"]
    assert m["rows"][0]["cells"]["a"]["state"] == "pass"
    assert m["rows"][2]["cells"]["b"]["state"] == "pass"


def test_summaries_give_the_same_matrix(tmp_path):
    full = sdpa_run()
    small = mx.summarize_run(full, "sdpa.json")
    assert len(small["cases"]) == 10  # the other implementations' cases are dropped
    path = tmp_path / "torch.sdpa.json"
    mx.write_summary(small, path)
    from te_conformance.reports.model import load_report

    assert mx.build_matrix([("a", load_report(path))]) == mx.build_matrix([("b", full)])


def test_the_report_tool_names_no_test_of_the_suites():
    """reports/ knows no test file or test function of the suites: a new suite test needs no
    edit there (it records its features, skips and expected differences)."""
    names = set()
    for path in (ROOT / "suites").rglob("test_*.py"):
        names.add(path.name)
        names |= set(re.findall(r"^def (test_\w+)", path.read_text(), re.M))
    found = {}
    for path in (ROOT / "reports").glob("*.py"):
        text = path.read_text()
        hits = sorted(n for n in names if re.search(rf"\b{re.escape(n)}\b", text))
        if hits:
            found[path.name] = hits
    assert not found, f"reports/ names the suites' tests: {found}"


# ----------------------------------------------------------------------------------- outputs


def test_html_is_self_contained_and_never_green_where_not_conformant():
    page = mx.render_html(mx.build_matrix([("sdpa.json", sdpa_run())]))
    assert not re.search(r"(?:src|href)=|https?://|url\(", page)
    cells = re.findall(r'<td class="cell state-(\w+)" style="background:#(\w{6});', page)
    assert {s for s, _ in cells} == {"pass", "partial", "fail", "known", "unsupported", "not_run"}

    def greenish(hex_colour):
        r, g, b = (int(hex_colour[i : i + 2], 16) for i in (0, 2, 4))
        return g > r and g > b

    for state, colour in cells:
        assert greenish(colour) == (state in ("pass", "partial")), (state, colour)
    for state in mx.STATES:
        assert f'class="state-{state}"' in page  # the legend
    assert "reproduce: <code>python -c &#x27;repro()&#x27;</code>" in page  # escaped


def test_cli_writes_the_four_files(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "sdpa" / "report.json"
    write_report(sdpa_run(), run)
    out = tmp_path / "out"
    assert (
        main(["matrix", str(run), "--out", str(out), "--save-summaries", str(tmp_path / "s")]) == 0
    )
    assert {p.name for p in out.iterdir()} == {
        "matrix.json",
        "matrix.md",
        "matrix.html",
        "matrix.png",
    }
    assert (tmp_path / "s" / "torch.sdpa.json").exists()
    m = json.loads((out / "matrix.json").read_text())
    assert mx.png_digest((out / "matrix.png").read_bytes()) == mx.digest(m)
    assert "torch.sdpa: " in capsys.readouterr().out


def test_cli_without_matplotlib_skips_the_png(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    run = tmp_path / "report.json"
    write_report(sdpa_run(), run)
    assert main(["matrix", str(run), "--out", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "matrix.png").exists()
    assert (tmp_path / "out" / "matrix.html").exists()
    assert "matrix.png skipped: matplotlib is not installed" in capsys.readouterr().out


# --------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p.write_text('{"schema": "something else"}'), "not a te-conformance report"),
        (lambda p: p.write_text("{"), "not valid JSON"),
        (lambda p: None, "no such file"),
        (lambda p: write_report(report(None, []), p), "'environment.impls' is missing"),
        (lambda p: write_report(report([], []), p), "does not say which implementation"),
        (lambda p: write_report(report(["x"], [], catalogue=None), p), "no feature catalogue"),
    ],
)
def test_bad_input_exits_2(tmp_path, capsys, make, message):
    path = tmp_path / "report.json"
    make(path)
    assert main(["matrix", str(path), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_two_runs_of_one_implementation_exit_2(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_report(sdpa_run(), a)
    write_report(report(["te_fast", "torch.sdpa"], []), b)
    assert main(["matrix", str(a), str(b), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"implementation 'torch.sdpa' is judged by two runs: {a} and {b}" in err


def test_no_report_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["matrix"])
    assert e.value.code == 2


# ----------------------------------------------------------------------- the plugin's impls


class _Config:
    def __init__(self, impl):
        self.impl = impl

    def getoption(self, name):
        return self.impl


def judged(impl) -> list[str]:
    """The names the suites' plugin hands the report (reports.plugin's pytest_te_report_impls)."""
    from te_conformance.suites.plugin import pytest_te_report_impls

    return [i["name"] for i in pytest_te_report_impls(_Config(impl))]


def test_the_report_names_the_adapters_it_judged():
    assert judged(["torch.sdpa"]) == ["torch.sdpa"]
    # a spec: the adapter's own name
    spec = "te_conformance.suites.adapters.flex_attention:FlexAttention"
    assert judged([spec]) == ["flex_attention"]
    from te_conformance.suites.adapters import ADAPTERS
    from te_conformance.suites.plugin import pytest_te_report_impls

    default = [name for name, adapter in ADAPTERS.items() if adapter.default]
    assert judged(None) == default  # the suites' default selection
    versions = {i["name"]: i["version"] for i in pytest_te_report_impls(_Config(["torch.sdpa"]))}
    assert versions == {"torch.sdpa": f"torch {torch.__version__}"}


def test_a_report_of_the_suites_records_what_the_matrix_reads(tmp_path):
    """Through pytest: environment.impls, impl_versions and the feature catalogue come from the
    suites' hooks; each case records its adapter, its features and its skip's kind."""
    from te_conformance.suites.features import catalogue

    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "--te-report", str(out), "--impl", "torch.sdpa", "-m", "not gpu", "-k",
         "invalid_arguments and mask or test_core and (bshd_bshd_bshd-fp32-causal-cpu or "
         "thd_thd_thd-fp32-padding-cpu or bs3hd-fp32-causal-gqa2-cpu) or test_broad and "
         "sbhd_bshd_bshd-fp32-causal-alibi-off-by-one-cpu",
         str(ROOT / "suites" / "conformance" / "test_attention.py")],
        cwd=ROOT, check=False, capture_output=True, timeout=300,
    )  # fmt: skip
    r = json.loads(out.read_text())
    env = r["environment"]
    assert env["impls"] == ["torch.sdpa"]
    assert env["impl_versions"] == {"torch.sdpa": f"torch {torch.__version__}"}
    assert env["features"] == catalogue()
    cases = {c["nodeid"].rpartition("::")[2]: c for c in r["cases"]}
    assert {c["adapter"] for c in cases.values()} == {"torch.sdpa"}
    ran = cases["test_core[bshd_bshd_bshd-fp32-causal-cpu-torch.sdpa]"]
    assert ran["outcome"] == "passed" and ran["features"] == ["layout_separate", "mask_causal"]
    thd = cases["test_core[thd_thd_thd-fp32-padding-cpu-torch.sdpa]"]
    assert thd["skip"]["kind"] == "declined" and thd["features"] == [
        "layout_thd", "mask_padding"]  # fmt: skip
    assert {r["feature"] for r in thd["skip"]["reasons"]} >= {"layout_thd", "mask_padding"}
    gqa = cases["test_core[bs3hd-fp32-causal-gqa2-cpu-torch.sdpa]"]
    assert gqa["skip"]["kind"] == "inexpressible"
    # test_broad's substitute: what ran counts in its rows, what was declined in its own
    broad = cases["test_broad[sbhd_bshd_bshd-fp32-causal-alibi-off-by-one-cpu-torch.sdpa]"]
    assert broad["outcome"] == "passed" and "layout_mixed" not in broad["features"]
    declined = {d["feature"]: d["text"] for d in broad["declined_features"]}
    assert {"layout_mixed", "alibi", "softmax_off-by-one"} <= set(declined), declined
    assert "does not support layout 'sbhd_bshd_bshd'" in declined["layout_mixed"]
    invalid = [c for n, c in cases.items() if n.startswith("test_invalid_arguments")]
    assert invalid and all(c["features"] == ["argument_checks"] for c in invalid)
    assert all(c["skip"]["kind"] == "declined" for c in invalid)


# ------------------------------------------------------------------ the committed picture


def committed_matrix() -> dict:
    paths = sorted((DOCS / "matrix_runs").glob("*.json"))
    assert paths, "docs/matrix_runs/ holds the runs docs/matrix.png draws (tools/matrix.sh)"
    return mx.build_matrix(mx.load_runs(paths), COLUMNS)


COLUMNS = ["te_fast", "torch.sdpa", "flex_attention", "transformer_engine"]  # tools/matrix.sh


def test_the_committed_matrix_is_the_committed_runs():
    """docs/matrix.{json,md,html,png} are what `python -m te_conformance matrix` makes of the
    runs in docs/matrix_runs/ (regenerate: tools/matrix.sh)."""
    m = committed_matrix()
    assert json.loads((DOCS / "matrix.json").read_text(encoding="utf-8")) == m
    assert (DOCS / "matrix.json").read_text(encoding="utf-8") == mx.matrix_json(m)
    assert (DOCS / "matrix.md").read_text(encoding="utf-8") == mx.render_markdown(m)
    assert (DOCS / "matrix.html").read_text(encoding="utf-8") == mx.render_html(m)
    assert mx.png_digest((DOCS / "matrix.png").read_bytes()) == mx.digest(m)
    assert set(m["runs"]) == set(COLUMNS)  # one run of each


def test_the_docs_hold_the_feature_table():
    from te_conformance.suites.features import catalogue

    text = (DOCS / "reports.md").read_text(encoding="utf-8")
    assert mx.feature_table_markdown(catalogue()) in text
