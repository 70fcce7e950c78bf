"""The release gate: coverage loss, shards, overrides, scopes, first runs, what reports say."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_reports_e2e import child_env, make_suite
from test_reports_unit import BASE, case, changed, names, report, write

from te_conformance.reports import baseline as B
from te_conformance.reports.__main__ import main
from te_conformance.reports.compare import compare, format_comparison
from te_conformance.reports.merge import merge_reports
from te_conformance.reports.model import ReportError, build_report, load_report, write_report
from te_conformance.reports.render import (
    failure_entries,
    heatmap_cells,
    render_html,
    render_markdown,
    tables,
    worst_at,
)

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- A: a gate not talked round


def test_update_baseline_refuses_lost_coverage_without_a_reason(tmp_path, capsys):
    base = write(tmp_path, "base.json", BASE)
    lossy = changed(test_d=None, test_e=("skipped", None), test_c=("passed", 0.5))
    lossy = write(tmp_path, "new.json", lossy)
    assert main(["compare", lossy, base, "--update-baseline"]) == 1
    out = capsys.readouterr().out
    assert "lost coverage of 2 baseline case(s)" in out and "--accept-loss" in out
    assert load_report(base) == BASE  # untouched
    why = "test_d moved to the GPU suite; test_e needs a GPU now"
    assert main(["compare", lossy, base, "--update-baseline", "--accept-loss", why]) == 0
    assert f"overridden: --accept-loss: 2 case(s) of lost coverage accepted: {why}" in (
        capsys.readouterr().out
    )
    accepted = B.load(base).accepted_loss
    assert accepted["reason"] == why
    assert [c.split(":")[0] for c in accepted["cases"]] == ["t.py", "t.py"]
    assert any("t.py::test_d" in c for c in accepted["cases"])
    assert any("t.py::test_e: passed -> skipped" in c for c in accepted["cases"])


def test_merge_refuses_a_missing_or_repeated_shard(tmp_path, capsys):
    s1 = report(*BASE["cases"][:3], shard="1/3")
    s2 = report(*BASE["cases"][3:5], shard="2/3")
    s3 = report(*BASE["cases"][5:], shard="3/3")
    assert merge_reports([("a", s1), ("b", s2), ("c", s3)])["cases"] == BASE["cases"]
    with pytest.raises(ReportError, match=r"shard\(s\) 2/3 missing: a merge needs all 3 shards"):
        merge_reports([("a", s1), ("c", s3)])
    with pytest.raises(ReportError, match=r"shard 1/3 is given twice"):
        merge_reports([("a", s1), ("a2", report(shard="1/3")), ("b", s2), ("c", s3)])
    with pytest.raises(ReportError, match=r"different splits"):
        merge_reports([("a", s1), ("x", report(shard="2/2"))])
    with pytest.raises(ReportError, match=r"x is not a shard report"):
        merge_reports([("x", BASE)])
    p1, p3 = write(tmp_path, "s1.json", s1), write(tmp_path, "s3.json", s3)
    out = tmp_path / "m.json"
    assert main(["merge", p1, p3, "-o", str(out)]) == 2
    assert "2/3 missing" in capsys.readouterr().err and not out.exists()


def test_comparison_names_xfails_and_nonfinite_ratios_for_what_they_are():
    xf = case("t.py::test_x", "xfailed", ratio=None)
    xf["skip_reason"] = "known gap"
    base = report(*BASE["cases"], xf)
    new_cases = changed(test_c=("xfailed", None))["cases"]  # failed -> xfailed
    nan_passed = case("t.py::test_b", ratio=0.6)
    nan_passed["tensors"][1]["ratio"] = "nan"
    minus_inf = case("t.py::test_d")
    minus_inf["tensors"][1]["ratio"] = "-inf"
    lost_checks = case("t.py::test_e", ratio=None)
    new_nan = case("t.py::test_new_nan")
    new_nan["tensors"][1]["ratio"] = "nan"
    keep = {"t.py::test_b", "t.py::test_d", "t.py::test_e"}
    new = report(
        *[c for c in new_cases if c["nodeid"] not in keep],
        nan_passed, minus_inf, lost_checks, new_nan, xf,
        case("t.py::test_new_error", "error", ratio=None),
    )  # fmt: skip
    result = compare(new, base)
    assert names(result, "excused_failures") == ["t.py::test_c"]
    assert "t.py::test_c" not in names(result, "improvements")
    assert names(result, "still_xfailed") == ["t.py::test_x"]
    assert names(result, "non_finite") == ["t.py::test_b", "t.py::test_d", "t.py::test_new_nan"]
    assert names(result, "lost_checks") == ["t.py::test_e"]
    assert names(result, "new_failures") == ["t.py::test_new_error"]
    assert "t.py::test_new_nan" not in names(result, "new_cases")
    assert result.regressions == 5


def test_comparison_tells_each_xfail_transition_what_it_is():
    """Known failures are strict (suites/known_failures.py): xfailed -> xfailed stays an expected
    failure (its reason change shown), failed -> xfailed is excused, not fixed, and neither is
    news that --update-baseline would accept as an improvement; xfailed -> failed (the
    recorded tensor passes: XPASS(strict), or another tensor fails) is a new failure."""

    def xfailed(nodeid, reason):
        c = case(nodeid, "xfailed", ratio=None)
        c["skip_reason"] = reason
        return c

    base = report(
        xfailed("t.py::test_same", "known failure: dk (SPEC §6 ratio, strict): diagnosed"),
        xfailed("t.py::test_reworded", "known failure: dk: old words"),
        case("t.py::test_excused", "failed", ratio=3.0),
        xfailed("t.py::test_broke", "known failure: dx (SPEC §6 ratio, strict): why"),
    )
    new = report(
        xfailed("t.py::test_same", "known failure: dk (SPEC §6 ratio, strict): diagnosed"),
        xfailed("t.py::test_reworded", "known failure: dk (SPEC §6 ratio, strict): new words"),
        xfailed("t.py::test_excused", "known failure: out (SPEC §6 ratio, strict): why"),
        case("t.py::test_broke", "failed", ratio=None),
    )
    result = compare(new, base)
    details = {n: d for items in result.items.values() for n, d in items}
    assert names(result, "still_xfailed") == ["t.py::test_reworded", "t.py::test_same"]
    assert details["t.py::test_same"] == "known failure: dk (SPEC §6 ratio, strict): diagnosed"
    assert details["t.py::test_reworded"] == (
        "reason was: known failure: dk: old words; now: known failure: dk (SPEC §6 ratio, "
        "strict): new words"
    )
    assert names(result, "excused_failures") == ["t.py::test_excused"]
    assert details["t.py::test_excused"].startswith("failed -> xfailed: known failure: out ")
    assert names(result, "new_failures") == ["t.py::test_broke"]
    assert details["t.py::test_broke"] == "xfailed -> failed"
    assert result.regressions == 1 and result.news == 0
    assert not result.items["improvements"]
    text = format_comparison(result, "new.json", "base.json")
    assert "info: failures now expected (failed -> xfailed: not fixed): 1" in text
    assert "info: still expected failures (xfailed in both): 2" in text
    assert "REGRESSION: new failures: 1" in text and "1 regression(s)" in text


# ---------------------------------------------------------------- B: reports that tell the truth


def _selected(*cases, **selection):
    r = report(*cases)
    r["environment"]["selection"] = {"paths": ["."], **selection}
    return r


def test_subset_run_answers_only_for_the_cases_it_selected():
    ran = [c for c in BASE["cases"] if "test_a" in c["nodeid"]]
    subset = compare(_selected(*ran, keyword="test_a"), BASE)
    assert subset.regressions == 0 and names(subset, "missing") == []
    assert subset.not_compared == len(BASE["cases"]) - len(ran)
    assert not subset.scope.complete and "-k test_a" in subset.scope.describe()
    full = compare(_selected(*ran), BASE)  # the same cases from a full run: the rest is missing
    assert full.scope.complete and len(names(full, "missing")) == 4
    # a full run of suites/ does not answer for the tool tests an old baseline holds
    old = report(case("suites/t.py::a"), case("tests/test_x.py::b"))
    new = report(case("suites/t.py::a"))
    new["environment"]["selection"] = {"paths": ["suites"], "default_paths": True}
    result = compare(new, old)
    assert result.regressions == 0 and result.not_compared == 1


def _verdict_report(status, reasons=(), notes=()):
    r = report(case("t.py::test_a", layout="bshd_bshd_bshd", dtype="bf16"))
    r["verdict"] = {"status": status, "passed": status != "FAIL", "reasons": list(reasons),
                    "notes": list(notes), "overrides": [], "exit_code": 1}  # fmt: skip
    return r


def test_the_verdict_is_shown_in_markdown_and_html():
    r = _verdict_report("FAIL", ["2 regression(s) against reports/baseline/cpu.json"])
    md, page = render_markdown(r), render_html(r)
    assert "**Verdict: FAIL — 2 regression(s) against reports/baseline/cpu.json**" in md
    assert '<p class="verdict FAIL">Verdict: FAIL' in page
    assert 'class="verdict PASS"' not in page
    first = _verdict_report("NO BASELINE", notes=["no baseline: 1 passed, 0 failed"])
    assert '<p class="verdict NO-BASELINE">Verdict: NO BASELINE' in render_html(first)


def test_skip_reasons_are_grouped_by_kind_and_recorded_reasons():
    """One row per recorded kind and set of recorded reasons (reports.record.skip), each reason
    once and sorted; a skip recorded by no suite is "unrecorded" with its text; the text of a
    recorded skip is never parsed."""
    recorded = [("declined", ["b", "a"]), ("declined", ["a", "b"]), ("declined", ["a", "b", "a"]),
                ("environment", ["a; b"]), (None, None)]  # fmt: skip
    cases = [case(f"t.py::test_{i}", "skipped", ratio=None) for i in range(len(recorded) + 1)]
    for c, (kind, reasons) in zip(cases, recorded):
        c["skip_reason"] = "; ".join(reasons) if reasons else "c"
        if kind:
            c["skip"] = {"kind": kind, "reasons": [{"text": r, "feature": None} for r in reasons]}
    cases[-1]["outcome"], cases[-1]["skip_reason"] = "xfailed", "known failure: c"
    table = next(t for t in tables(report(*cases)) if t.title == "Skip reasons")
    assert table.rows == [["declined", "a; b", 3], ["environment", "a; b", 1],
                          ["unrecorded", "c", 1], ["xfail", "known failure: c", 1]]  # fmt: skip


def test_failure_text_appears_once_with_a_reproducer_and_named_axes():
    msg = "AssertionError: out: max |impl - ref64| = 3e-3 > bound 1e-3; worst at [0, 1, 2]"
    fuzz = case("s/test_fuzz.py::test_softmax", "failed", ratio=None)
    fuzz["message"] = "AssertionError: softmax off"
    fuzz["longrepr"] = "def test():\n>   check()\nE   AssertionError: softmax off"
    fuzz["reproducer"] = "python -c 'check_softmax_example(...)'"  # the test recorded it
    attn = case("s/test_attention.py::test_core[bshd]", "failed", ratio=3.0,
                layout="bshd_bshd_bshd", dtype="bf16")  # fmt: skip
    attn["message"] = msg
    attn["longrepr"] = f"def test():\n>   judge()\nE   {msg}\n\ns/checks.py:9: AssertionError"
    attn["tensors"][1]["worst_index"] = [0, 1, 2]
    r = report(fuzz, attn, pytest_args=["--impl", "te_fast", "-n", "auto"])
    comparison = compare(r, report(case(attn["nodeid"]), case(fuzz["nodeid"])))
    from te_conformance.reports.compare import format_comparison

    text = format_comparison(comparison, "new", "base")
    entries = {f.nodeid: f for f in failure_entries(r)}
    assert entries[fuzz["nodeid"]].reproducer == "python -c 'check_softmax_example(...)'"
    assert entries[attn["nodeid"]].reproducer == (
        "python -m pytest -p no:xdist --impl te_fast 's/test_attention.py::test_core[bshd]'"
    )
    assert entries[attn["nodeid"]].worst == "worst tensor out: ratio 3 at b=0, s=1, hd=2"
    for rendered in (render_markdown(r, text), render_html(r, text)):
        assert rendered.count("max |impl - ref64| = 3e-3") == 1, rendered
        assert rendered.count("softmax off") == 1
        assert "check_softmax_example(...)" in rendered
        assert "b=0, s=1, hd=2" in rendered


def test_worst_element_axes_follow_the_layout():
    c = case("t.py::x", layout="sbhd_bs2hd", dtype="bf16")
    assert worst_at(c, {"name": "dq", "worst_index": [3, 0, 1, 2]}) == "s=3, b=0, h=1, d=2"
    assert worst_at(c, {"name": "dk", "worst_index": [0, 3, 1, 2]}) == "b=0, s=3, h=1, d=2"
    assert worst_at(c, {"name": "dbias", "worst_index": [0, 1, 2, 3]}) == "b=0, h=1, s_q=2, s_k=3"
    op = case("t.py::y", layout="op:scaled_softmax")
    assert worst_at(op, {"name": "y", "worst_index": [0, 1, 2, 3]}) == "b=0, h=1, s_q=2, s_k=3"
    assert worst_at(case("t.py::z"), {"name": "w", "worst_index": [4, 5]}) == "[4, 5]"


def test_failed_cases_are_red_in_the_heatmap():
    ok = case("t.py::a", ratio=0.1, layout="bshd", dtype="bf16")
    semantics = case("t.py::b", "failed", ratio=None, layout="thd", dtype="fp16")
    low = case("t.py::c", "failed", ratio=0.2, layout="bshd", dtype="fp16")
    worst, failed = heatmap_cells(report(ok, semantics, low))
    assert worst[("bshd", "bf16")] == pytest.approx(0.1)
    assert worst[("thd", "fp16")] > 1 and worst[("bshd", "fp16")] > 1  # above the pass line
    assert failed == {("thd", "fp16"): 1, ("bshd", "fp16"): 1}


def deviation(id_: str, title: str, where: str | None, reproducer: str | None) -> dict:
    """An ``expected`` record of a TE deviation, as the suites' expected outcomes make it."""
    e = {"source": "te_deviation", "id": id_, "reason": f"why {id_}", "title": title,
         "checks": ["ratio"], "tensors": [], "strict": True, "outcome": "skipped"}  # fmt: skip
    e.update({k: v for k, v in (("where", where), ("reproducer", reproducer)) if v})
    return e


D1 = deviation("D1", "unbounded window side bounded by the wrong length", "utils.py:2068-2071",
               "python -m te_conformance.suites.te_deviations D1")  # fmt: skip
D2 = deviation("D2", "softmax offset ignored in the backward", "softmax.py:10-12",
               "python -m te_conformance.suites.te_deviations D2")  # fmt: skip
FALLBACK = deviation("fallback", "fused backend refused, unfused path used", None, None)


def test_te_deviations_are_grouped_in_their_own_section():
    """The section reads the cases' expected records (source te_deviation): id, title, TE's
    lines and the reproducer; nothing is parsed out of a reason's text."""
    cases = [case(f"s/t.py::test_{i}", "xfailed", ratio=None) for i in range(4)]
    for c, found in zip(cases, (D1, D1, D2, FALLBACK)):
        c["skip_reason"] = "the expected differences' labels, never parsed"
        c["expected"] = [found]
    r = report(*cases, case("s/t.py::other"))
    table = next(t for t in tables(r) if t.title == "TE deviations")
    assert table.rows == [
        ["D1", "unbounded window side bounded by the wrong length", "utils.py:2068-2071", 2,
         "python -m te_conformance.suites.te_deviations D1"],
        ["D2", "softmax offset ignored in the backward", "softmax.py:10-12", 1,
         "python -m te_conformance.suites.te_deviations D2"],
        ["fallback", "fused backend refused, unfused path used", "-", 1, "-"],
    ]  # fmt: skip
    assert "## TE deviations" in render_markdown(r) and "<h2>TE deviations</h2>" in render_html(r)
    assert all(t.title != "Skip reasons" for t in tables(r))  # each xfail shown once
    plain = report(case("s/t.py::other"))
    assert "TE deviations" not in render_markdown(plain) + render_html(plain)
    failed = case("s/t.py::failed", "failed", ratio=None)
    failed["expected"] = [D1]  # an expectation a failing case carried explains nothing
    assert "TE deviations" not in render_markdown(report(failed))


def test_a_case_several_deviations_explain_counts_for_each():
    """Each deviation a case carries gets the case; the intro counts the case once."""
    both = case("s/t.py::test_both", "xfailed", ratio=None)
    both["expected"] = [D1, FALLBACK]
    r = report(both)
    table = next(t for t in tables(r) if t.title == "TE deviations")
    assert [row[0] for row in table.rows] == ["D1", "fallback"]
    assert [row[3] for row in table.rows] == [1, 1]
    assert table.note.startswith("1 xfailed case(s)"), table.note


# ---------------------------------------------------------------- run, end to end


def run_cli(suite: Path, out: Path, *args: str, pytest_args=()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "te_conformance", "run", "--out", str(out), *args, "-n", "0",
           "-p", "no:cacheprovider", "--rootdir", str(suite), "-c", str(suite / "pytest.ini"),
           *pytest_args, str(suite)]  # fmt: skip
    return subprocess.run(cmd, cwd=suite, env=child_env(), capture_output=True, text=True,
                          timeout=180)  # fmt: skip


def verdict_lines(proc) -> list[str]:
    return proc.stdout.split("TE conformance verdict")[1].splitlines()[1:]


def test_run_gates_first_runs_subsets_and_coverage_loss(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    make_suite(suite, INCLUDE_FAILING=False)
    out, base = tmp_path / "out", tmp_path / "base.json"

    first = run_cli(suite, out, "--baseline", str(base))  # no baseline, nothing failing
    assert first.returncode == 0, first.stdout + first.stderr
    assert verdict_lines(first)[0] == "NO BASELINE"
    assert "no baseline: 4 passed, 0 failed" in first.stdout
    assert f"compare {out / 'report.json'} {base} --update-baseline" in first.stdout
    stored = json.loads((out / "report.json").read_text())["verdict"]
    assert stored["status"] == "NO BASELINE" and stored["run_kind"] == "full"

    assert run_cli(suite, out, "--baseline", str(base), "--update-baseline").returncode == 0
    subset = run_cli(suite, out, "--baseline", str(base), pytest_args=["-k", "attn"])
    assert subset.returncode == 0, subset.stdout + subset.stderr
    assert "run: subset run (-k attn)" in subset.stdout
    assert verdict_lines(subset)[0] == "PASS" and "REGRESS" not in subset.stdout
    assert "3 baseline case(s) not compared (not selected by this run)" in subset.stdout

    # one case passed -> skipped, one gone
    text = (suite / "test_tiny.py").read_text()
    text = text.replace('"fp32": 0.01}', "}").replace(
        "def test_compiled", '@pytest.mark.skip(reason="lost")\ndef test_compiled'
    )
    (suite / "test_tiny.py").write_text(text)
    before = base.read_text()
    lossy = run_cli(suite, out, "--baseline", str(base), "--update-baseline")
    assert lossy.returncode == 1, lossy.stdout + lossy.stderr
    assert verdict_lines(lossy)[0] == "FAIL"
    assert "refusing to update the baseline" in lossy.stdout and base.read_text() == before
    assert "Verdict: FAIL" in (out / "report.md").read_text()
    assert '<p class="verdict FAIL">' in (out / "report.html").read_text()
    assert json.loads((out / "report.json").read_text())["verdict"]["status"] == "FAIL"

    why = "fp32 moved to its own suite"
    accepted = run_cli(suite, out, "--baseline", str(base), "--update-baseline",
                       "--accept-loss", why)  # fmt: skip
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert B.load(base).accepted_loss["reason"] == why
    verdict = json.loads((out / "report.json").read_text())["verdict"]
    assert verdict["overrides"] == [f"--accept-loss: 2 case(s) of lost coverage accepted: {why}"]
    assert f"overridden: --accept-loss: 2 case(s) of lost coverage accepted: {why}" in (
        accepted.stdout
    )


def test_a_first_run_with_failures_still_fails(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    make_suite(suite)
    proc = run_cli(suite, tmp_path / "out", "--baseline", str(tmp_path / "none.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert verdict_lines(proc)[0] == "FAIL" and "2 failing case(s)" in proc.stdout


# ---------------------------------------------------------------- C: the product's verdict


def test_run_judges_the_suites_not_the_tool_tests(tmp_path, monkeypatch):
    import te_conformance.reports.__main__ as cli

    commands = []

    def fake_pytest(cmd):
        commands.append(cmd)
        write_report(build_report([], {"machine_class": "cpu"}), cmd[cmd.index("--te-report") + 1])
        return 5

    monkeypatch.setattr(cli, "_run_pytest", fake_pytest)
    monkeypatch.chdir(ROOT)
    main(["run", "--out", str(tmp_path), "--no-compare"])
    assert commands[0][-2:] == ["--te-default-paths", "suites"] and "tests" not in commands[0]
    main(["run", "--out", str(tmp_path), "--no-compare", "--", "tests/test_verdict.py"])
    assert commands[1][-1] == "tests/test_verdict.py" and "--te-default-paths" not in commands[1]


def test_ci_runs_the_tool_tests_apart_under_its_own_variable():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^export TE_CONFORMANCE_CI=1$", ci, re.M)
    assert re.search(r"^pytest -n auto .*tests$", ci, re.M)
    for test in ("test_report_browser.py", "test_same_sass.py"):
        text = (ROOT / "tests" / test).read_text()
        assert 'environ.get("CI"' not in text and "TE_CONFORMANCE_CI" in text, test
