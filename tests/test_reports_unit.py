"""compare, merge, model and render on synthetic report dicts (no pytest subprocess)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from te_conformance.reports import baseline as B
from te_conformance.reports.__main__ import main
from te_conformance.reports.compare import compare, format_comparison
from te_conformance.reports.merge import merge_reports
from te_conformance.reports.model import (
    ReportError,
    build_report,
    load_report,
    worst_ratio,
    write_report,
)
from te_conformance.reports.render import render, render_html, render_markdown, summary_line


def case(nodeid, outcome="passed", ratio=0.1, **fields):
    """A synthetic case; ratio None means no compared tensors."""
    tensors = (
        []
        if ratio is None
        else [
            {"name": "dq", "max_abs_err": 1e-4, "bound": 1e-3, "ratio": 0.001},
            {"name": "out", "max_abs_err": ratio, "bound": 1.0, "ratio": ratio},
        ]
    )
    return {
        "nodeid": nodeid,
        "id": nodeid.rsplit("::", 1)[-1],
        "outcome": outcome,
        "fields": fields,
        "tensors": tensors,
        "counters": {},
        "duration_s": 0.01,
        "message": "AssertionError: out: ratio 3 > 1" if outcome in ("failed", "error") else None,
        "longrepr": "def test():\n>   assert ratio <= 1\nE   AssertionError"
        if outcome == "failed"
        else None,
        "skip_reason": "needs a GPU" if outcome == "skipped" else None,
        "worker": None,
        "cuda_visible_devices": None,
    }


# the machine both sides of a comparison ran on, unless a test says otherwise
FINGERPRINT = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "isa_variables": {}, "gpus": [],
               "torch": "2.13.0+cpu", "torch_cuda": None}  # fmt: skip


def report(*cases, **env):
    return build_report(
        list(cases), {"machine_class": "cpu", "fingerprint": FINGERPRINT, **env}, 1.0
    )


BASE = report(
    case("t.py::test_a[bf16]", ratio=0.2),
    case("t.py::test_a[fp16]", ratio=0.2),
    case("t.py::test_a[fp32]", ratio=0.01),
    case("t.py::test_b", ratio=0.6),
    case("t.py::test_c", "failed", ratio=3.0),
    case("t.py::test_d"),
    case("t.py::test_e"),
    case("t.py::test_f", "skipped", ratio=None),
)


def changed(**outcomes_and_ratios):
    """BASE with some cases changed: name=(outcome, ratio) or name=None (removed)."""
    cases = []
    for c in BASE["cases"]:
        key = c["nodeid"].split("::")[1].replace("[", "_").rstrip("]")
        if key not in outcomes_and_ratios:
            cases.append(c)
        elif outcomes_and_ratios[key] is not None:
            outcome, ratio = outcomes_and_ratios[key]
            cases.append(case(c["nodeid"], outcome, ratio))
    return report(*cases)


def outcomes(path) -> dict:
    """A baseline file's (or report's) outcome and worst ratio per case key."""
    return {k: (e.outcome, e.ratio) for k, e in B.load(path).entries.items()}


def names(result, category):
    return [nodeid for nodeid, _ in result.items[category]]


# ---------------------------------------------------------------- compare


def test_identical_reports_have_no_regressions():
    result = compare(BASE, BASE)
    assert result.regressions == 0 and result.news == 0
    assert names(result, "still_failing") == ["t.py::test_c"]


def test_new_failure_is_a_regression():
    result = compare(changed(test_a_bf16=("failed", 3.0)), BASE)
    assert names(result, "new_failures") == ["t.py::test_a[bf16]"]
    assert "passed -> failed" in result.items["new_failures"][0][1]
    assert result.regressions == 1


def test_ratio_growth_is_a_regression_above_noise_only():
    new = changed(
        test_a_bf16=("passed", 0.5), test_a_fp16=("passed", 0.25), test_a_fp32=("passed", 0.04)
    )
    result = compare(new, BASE)
    # 0.2 -> 0.5 is x2.5; 0.2 -> 0.25 is within x1.5; 0.01 -> 0.04 stays under min_ratio 0.05
    assert names(result, "ratio_regressions") == ["t.py::test_a[bf16]"]
    assert "0.2 (out) -> 0.5 (out)" in result.items["ratio_regressions"][0][1]
    assert names(compare(new, BASE, min_ratio=0.01), "ratio_regressions") == [
        "t.py::test_a[bf16]",
        "t.py::test_a[fp32]",
    ]
    assert names(compare(new, BASE, factor=3.0), "ratio_regressions") == []


def test_improvements_and_new_cases_are_information():
    new = report(
        *changed(test_c=("passed", 0.5), test_b=("passed", 0.1))["cases"], case("t.py::test_new")
    )
    result = compare(new, BASE)
    assert result.regressions == 0
    assert names(result, "improvements") == ["t.py::test_b", "t.py::test_c"]
    assert names(result, "new_cases") == ["t.py::test_new"]
    assert "info: improvements: 2" in format_comparison(result, "new", "base")


def test_missing_case_and_lost_coverage_are_regressions():
    result = compare(changed(test_d=None, test_e=("skipped", None), test_f=None), BASE)
    assert names(result, "missing") == ["t.py::test_d"]
    assert names(result, "lost_coverage") == ["t.py::test_e"]
    assert names(result, "dropped_skips") == ["t.py::test_f"]  # nothing was tested: no loss
    assert result.regressions == 2


def test_every_outcome_that_turns_skipped_is_lost_coverage():
    """Issue 46, item 5: a case that now skips judged something before, whatever its outcome
    was. failed -> skipped counted as an improvement (it hides the failure) and xfailed ->
    skipped matched no category at all; both are lost coverage now, a regression that
    --update-baseline refuses without --accept-loss."""
    before = ("passed", "failed", "error", "xfailed", "xpassed", "skipped")
    base = report(*(case(f"t.py::test_{o}", o, ratio=None) for o in before))
    new = report(*(case(f"t.py::test_{o}", "skipped", ratio=None) for o in before))
    result = compare(new, base)
    lost = [f"t.py::test_{o}" for o in sorted(before) if o != "skipped"]
    assert names(result, "lost_coverage") == lost
    assert names(result, "improvements") == []
    assert result.regressions == len(lost)
    assert "failed -> skipped" in dict(result.items["lost_coverage"])["t.py::test_failed"]


def test_a_passing_case_that_now_xfails_is_lost_coverage():
    """Issue 46, item 8: passed -> xfailed (a new known failure or declared difference that
    excuses a case which passed) judges less than before: lost coverage, a regression that
    --update-baseline refuses without --accept-loss, never an excused failure or news."""
    base = report(case("t.py::test_a"), case("t.py::test_b"))
    new = report(case("t.py::test_a", "xfailed", ratio=None), case("t.py::test_b"))
    result = compare(new, base)
    assert names(result, "lost_coverage") == ["t.py::test_a"]
    assert dict(result.items["lost_coverage"])["t.py::test_a"].startswith("passed -> xfailed")
    assert result.regressions == 1 and result.coverage_loss and result.news == 0
    assert names(result, "excused_failures") == []


def test_nonfinite_ratios_compare():
    nan_case = case("t.py::test_b", ratio=0.6)
    nan_case["tensors"][1]["ratio"] = "nan"
    result = compare(
        report(*[c for c in BASE["cases"] if c["nodeid"] != "t.py::test_b"], nan_case), BASE
    )
    assert names(result, "non_finite") == ["t.py::test_b"]
    assert names(result, "ratio_regressions") == []
    assert worst_ratio(nan_case) == float("inf")


# ---------------------------------------------------------------- compare CLI


def write(tmp_path, name, data):
    path = tmp_path / name
    write_report(data, path) if isinstance(data, dict) and "schema" in data else path.write_text(
        data if isinstance(data, str) else json.dumps(data)
    )
    return str(path)


def test_compare_cli_exit_codes(tmp_path, capsys):
    base = write(tmp_path, "base.json", BASE)
    assert main(["compare", base, base]) == 0
    bad = write(tmp_path, "new.json", changed(test_a_bf16=("failed", 3.0)))
    assert main(["compare", bad, base]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION: new failures: 1" in out and "t.py::test_a[bf16]" in out


def test_compare_cli_prints_how_to_accept_improvements(tmp_path, capsys):
    base = write(tmp_path, "base.json", BASE)
    better = write(tmp_path, "new.json", changed(test_c=("passed", 0.5)))
    assert main(["compare", better, base]) == 0
    assert f"compare {better} {base} --update-baseline" in capsys.readouterr().out
    assert main(["compare", better, base, "--update-baseline"]) == 0
    assert outcomes(base) == outcomes(better)  # the baseline file now holds that run


def test_compare_cli_refuses_to_accept_failures(tmp_path, capsys):
    base = write(tmp_path, "base.json", BASE)
    worse = write(tmp_path, "new.json", changed(test_a_bf16=("failed", 3.0)))
    assert main(["compare", worse, base, "--update-baseline"]) == 1
    assert "refusing" in capsys.readouterr().out
    assert load_report(base) == BASE
    assert main(["compare", worse, base, "--update-baseline", "--force"]) == 0


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ({"schema": "something-else", "schema_version": 1}, "not a te-conformance report"),
        ({**BASE, "schema_version": 99}, "unsupported schema_version 99"),
        ({**BASE, "cases": {}}, "'cases' is missing or not a list"),
        ({**BASE, "cases": [{"nodeid": "x", "outcome": "weird"}]}, "unknown outcome 'weird'"),
        (None, "no such file"),
    ],
)
def test_corrupt_baseline_is_a_clear_error(tmp_path, capsys, content, message):
    new = write(tmp_path, "new.json", BASE)
    base = str(tmp_path / "base.json") if content is None else write(tmp_path, "base.json", content)
    assert main(["compare", new, base]) == 2
    err = capsys.readouterr().err
    assert message in err and base in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ---------------------------------------------------------------- merge


def test_merge_is_lossless_and_rejects_duplicates(tmp_path, capsys):
    a = report(*BASE["cases"][:3], shard="1/2")
    b = report(*BASE["cases"][3:], shard="2/2")
    merged = merge_reports([("a.json", a), ("b.json", b)])
    assert merged["cases"] == BASE["cases"]
    assert merged["summary"] == {**BASE["summary"], "duration_s": 1.0}
    assert [s["shard"] for s in merged["environment"]["shards"]] == ["1/2", "2/2"]

    with pytest.raises(ReportError, match=r"t\.py::test_b is in both a\.json and c\.json"):
        overlapping = report(*BASE["cases"][:4], shard="1/2")
        merge_reports([("a.json", overlapping), ("c.json", report(BASE["cases"][3], shard="2/2"))])

    pa, pb = write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)
    out = tmp_path / "m.json"
    assert main(["merge", pa, pb, "-o", str(out)]) == 0
    assert load_report(out)["cases"] == BASE["cases"]
    assert main(["merge", pa, pa, "-o", str(out)]) == 2
    assert "shard 1/2 is given twice" in capsys.readouterr().err


def test_a_partial_report_stays_partial(tmp_path, capsys):
    """A run stopped early (summary.interrupted): its headline says so and passes nothing, a merge
    with it is partial, it cannot become the baseline without --force, and the field is checked."""
    whole = report(*BASE["cases"][:3], shard="1/2")
    stopped = build_report(
        [c for c in BASE["cases"][3:] if c["outcome"] == "passed"],
        {"machine_class": "cpu", "shard": "2/2"},
        1.0,
        interrupted="SIGTERM",
        collected=9,
    )
    assert stopped["summary"]["interrupted"] == "SIGTERM"
    assert "interrupted" not in whole["summary"]  # a whole run's summary is as it was
    assert summary_line(stopped).startswith(
        "Tests INCOMPLETE (stopped by SIGTERM, 9 collected): 3 passed of 3 cases"
    )
    assert summary_line(whole).startswith("Tests PASS")
    assert '<p class="verdict FAIL">Tests INCOMPLETE' in render_html(stopped)

    merged = merge_reports([("a.json", whole), ("b.json", stopped)])
    assert merged["summary"]["interrupted"] == "b.json: SIGTERM"
    assert merged["summary"]["collected"] == 3 + 9
    rest = report(*BASE["cases"][3:], shard="2/2")
    assert "interrupted" not in merge_reports([("a.json", whole), ("b.json", rest)])["summary"]

    base = write(tmp_path, "base.json", BASE)
    partial = write(tmp_path, "new.json", stopped)
    assert main(["compare", partial, base, "--update-baseline"]) == 1
    assert "the run was stopped early (SIGTERM) and its report is partial" in (
        capsys.readouterr().out
    )
    assert load_report(base) == BASE
    assert main(["compare", partial, base, "--update-baseline", "--force"]) == 1  # cases lost
    capsys.readouterr()
    args = ["--update-baseline", "--force", "--accept-loss", "a shorter run on purpose"]
    assert main(["compare", partial, base, *args]) == 0
    assert B.load(base).accepted_loss["reason"] == "a shorter run on purpose"

    bad = write(tmp_path, "bad.json", {**BASE, "summary": {**BASE["summary"], "interrupted": 15}})
    with pytest.raises(ReportError, match="'summary.interrupted' is not a string"):
        load_report(bad)


# ---------------------------------------------------------------- render

RICH = report(
    case(
        "s/test_attn.py::test_fwd[bshd-bf16]",
        ratio=0.4,
        layout="bshd",
        dtype="bf16",
        impl="te_fast",
    ),
    case(
        "s/test_attn.py::test_fwd[bshd-fp16]",
        "failed",
        ratio=2.5,
        layout="bshd",
        dtype="fp16",
        impl="te_fast",
    ),
    case(
        "s/test_attn.py::test_fwd[sbhd-fp16]",
        ratio=0.0,
        layout="sbhd",
        dtype="fp16",
        impl="te_fast.compiled",
    ),
    case("s/test_attn.py::test_gpu", "skipped", ratio=None),
    case("s/test_ops.py::test_softmax|pipe", "error", ratio=5.0, layout="op:softmax"),
    case("s/test_ops.py::test_inf", ratio=0.2, layout="op:softmax", dtype="fp32"),
    gpus=[{"name": "NVIDIA H100 80GB HBM3", "driver": "550.54"}],
    git_commit="abc123-dirty",
)
_rich = {c["id"]: c for c in RICH["cases"]}
_rich["test_fwd[sbhd-fp16]"]["counters"] = {
    "graph_breaks": 2,
    "recompiles": 1,
    "graphs_recorded": 3,
}
_rich["test_fwd[bshd-bf16]"].update(worker="gw0", cuda_visible_devices="1")
_rich["test_fwd[bshd-fp16]"].update(worker="gw1", cuda_visible_devices="0")
_rich["test_inf"]["tensors"].append(
    {"name": "dk", "max_abs_err": "inf", "bound": 1.0, "ratio": "inf"}
)


def test_markdown_has_every_section():
    md = render_markdown(RICH, comparison="no regressions against the baseline")
    for heading in (
        "Comparison with the baseline",
        "Environment",
        "Results by layout x dtype",
        "Worst 5 cases by ratio",
        "Skip reasons",
        "graph breaks",
        "Cases per GPU",
        "Cases per worker",
        "Failures (2)",
    ):
        assert heading in md, heading
    assert "NVIDIA H100 80GB HBM3" in md and "abc123-dirty" in md
    assert "| needs a GPU | 1 |" in md
    assert "test_softmax\\|pipe" in md  # a pipe in a cell does not break the table
    assert "| bshd | fp16 | te_fast | 1 | 0 | 1 | 0 | 2.5 |" in md
    worst = md.split("## Worst")[1].split("##")[0]
    assert worst.index("test_inf") < worst.index("test_fwd[bshd-fp16]")  # inf ratio ranks first


def test_html_is_self_contained_with_plots(tmp_path):
    pytest.importorskip("matplotlib")
    md, page = render(RICH, tmp_path / "out")
    assert md.exists() and page.exists()
    text = page.read_text()
    assert text.count('src="data:image/png;base64,') == 3
    assert "http://" not in text and "https://" not in text and 'src="http' not in text
    assert "<link" not in text and "<script" not in text
    assert "Results by layout x dtype x impl" in text and "Failures (2)" in text


def test_html_without_matplotlib(tmp_path, monkeypatch):
    for mod in [m for m in sys.modules if m.startswith("matplotlib")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, mod, None)  # `import matplotlib` now raises
    text = render_html(RICH)
    assert "plots unavailable: matplotlib not installed" in text
    assert "<img" not in text and "Worst 5 cases by ratio" in text
    _, page = render(RICH, tmp_path)
    assert page.exists()


def test_render_empty_and_cli(tmp_path, capsys):
    empty = write(tmp_path, "r.json", report())
    assert main(["render", empty]) == 0
    assert "no cases" in (tmp_path / "report.md").read_text()
    assert "report.html" in capsys.readouterr().out


def test_headline_worst_ratio_of_a_gpu_run_comes_from_the_gpu_cases():
    """A GPU run runs the CPU cases too; its headline must not quote a worse CPU ratio."""
    cases = [
        case("t.py::test_a[cpu]", ratio=0.9, device="cpu"),
        case("t.py::test_a[cuda]", ratio=0.4, device="cuda"),
        case("t.py::test_b[cuda]", ratio=0.6, device="cuda"),
        case("t.py::test_c", ratio=0.95),  # no device recorded: not a GPU case
        case("t.py::test_d[cuda]", "skipped", ratio=None, device="cuda"),
    ]
    gpu_run = summary_line(report(*cases))
    assert "worst GPU ratio 0.6 (test_b[cuda], out)" in gpu_run, gpu_run
    for text in (render_markdown(report(*cases)), render_html(report(*cases))):
        assert "worst GPU ratio 0.6 (test_b[cuda], out)" in text
    # without a rated GPU case (a CPU run, or every GPU case skipped) all cases count
    cpu_run = summary_line(report(*[c for c in cases if "cuda" not in c["nodeid"]], cases[-1]))
    assert "worst ratio 0.95 (test_c, out)" in cpu_run, cpu_run


def test_run_with_impl_gates_that_adapter_against_its_own_baseline(tmp_path, monkeypatch, capsys):
    """`run --impl NAME`: pytest gets --impl NAME and the default scope (the suites' plugin keeps
    the tests that take an adapter); the baseline is <class>.<NAME>.json, never the default
    adapter's."""
    import te_conformance.reports.__main__ as cli

    commands = []

    def fake_pytest(cmd):
        commands.append(cmd)
        out = cmd[cmd.index("--te-report") + 1]
        nodeid = "suites/conformance/test_attention.py::t[x-transformer_engine]"
        write_report(report(case(nodeid)), out)
        return 0

    monkeypatch.setattr(cli, "_run_pytest", fake_pytest)
    monkeypatch.chdir(cli.Path(__file__).resolve().parents[1])  # the repository: suites/ exists
    out = str(tmp_path / "out")
    args = ["run", "--out", out, "--machine-class", "h200", "--impl", "transformer_engine"]
    assert main([*args, "-n", "2"]) == 0  # no such baseline: NO BASELINE, not "missing cases"
    text = capsys.readouterr().out
    assert "no baseline at reports/baseline/h200.transformer_engine.json" in text, text
    assert "\nNO BASELINE\n" in text
    assert commands[0][-6:] == ["--impl", "transformer_engine", "-n", "2",
                                "--te-default-paths", "suites"]  # fmt: skip
    main([*args, "--", "suites/conformance/test_attention.py::test_core", "-x"])
    assert commands[1][-4:] == ["--impl", "transformer_engine",
                                "suites/conformance/test_attention.py::test_core", "-x"]
    main(["run", "--out", out, "--machine-class", "h200", "--no-compare"])
    assert "--impl" not in commands[2] and commands[2][-1] == "suites"
    capsys.readouterr()
    # the default adapter's cases are the default run's: --impl te_fast shares its baseline
    main(["run", "--out", out, "--machine-class", "h200", "--impl", "te_fast"])
    assert "no baseline at reports/baseline/h200.json" in capsys.readouterr().out
    assert commands[3][commands[3].index("--impl") + 1] == "te_fast"


@pytest.fixture(scope="module")
def collected_rooms() -> dict[str, list[str]]:
    """The suites' node ids collected without and with --impl (no test runs)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    found = {}
    for key, extra in (("default", []), ("impl", ["--impl", "torch.sdpa"])):
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             "-p", "no:xdist", *extra, "suites"],
            cwd=root, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        found[key] = [n for n in out.stdout.split() if "::" in n]
        assert found[key], out.stdout[-2000:] + out.stderr[-2000:]
    return found


def test_impl_selects_the_adapter_tests_by_that_fact(collected_rooms):
    """--impl keeps exactly the tests of the conformance room (every one of which takes an
    adapter: suites/plugin.py check_rooms), each of the named adapter; none of te_fast's own
    tests or the judge's."""
    impl = collected_rooms["impl"]
    assert all(n.startswith("suites/conformance/") and "-torch.sdpa" in n.rpartition("[")[2]
               for n in impl), impl[:5]  # fmt: skip
    rooms = {n.split("/")[1] for n in collected_rooms["default"]}
    assert rooms == {"conformance", "te_fast", "judge"}


def test_a_test_in_the_wrong_room_is_a_usage_error():
    from te_conformance.suites.plugin import check_rooms

    class Item:
        def __init__(self, path, fixturenames):
            self.path, self.fixturenames = path, fixturenames
            self.nodeid = str(path)

    suites = Path(__file__).resolve().parents[1] / "suites"
    check_rooms([Item(suites / "conformance" / "test_x.py", ["adapter", "case"]),
                 Item(suites / "te_fast" / "test_y.py", ["device_name"])])  # fmt: skip
    for item, said in ((Item(suites / "conformance" / "test_x.py", ["case"]), "takes no adapter"),
                       (Item(suites / "judge" / "test_z.py", ["adapter"]), "takes adapter"),
                       (Item(suites / "test_top.py", []), "not in a room")):  # fmt: skip
        with pytest.raises(pytest.UsageError, match=said):
            check_rooms([item])
