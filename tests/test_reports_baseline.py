"""The verdict's machine-independence and the compact baseline: fingerprints, case keys, drift,
subset runs applied to the baseline, lost checks, the rename map (synthetic reports)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from te_conformance.reports import baseline as B
from te_conformance.reports.__main__ import main
from te_conformance.reports.compare import compare
from te_conformance.reports.model import (
    ReportError,
    build_report,
    case_key,
    run_scope,
    write_report,
)
from te_conformance.reports.plugin import in_shard

FP = {"cpu": "AMD EPYC", "cpu_capability": "AVX512", "isa_variables": {}, "gpus": [],
      "torch": "2.13.0+cpu", "torch_cuda": None}  # fmt: skip
FP_AVX2 = {**FP, "cpu_capability": "AVX2",
           "isa_variables": {"ATEN_CPU_CAPABILITY": "avx2"}}  # fmt: skip


def case(nodeid, outcome="passed", ratio=0.1, tensors=("out", "dq"), marks=(), keywords=None,
         reason=None, **fields):  # fmt: skip
    return {
        "nodeid": nodeid,
        "key": case_key(nodeid),
        "id": nodeid.rsplit("::", 1)[-1],
        "outcome": outcome,
        "fields": fields,
        "tensors": [] if ratio is None else [
            {"name": t, "max_abs_err": ratio, "bound": 1.0, "ratio": ratio if i == 0 else 0.01}
            for i, t in enumerate(tensors)
        ],
        "counters": {},
        "duration_s": 0.5,
        "message": None,
        "longrepr": "Traceback ... long text" if outcome == "failed" else None,
        "skip_reason": reason,
        "marks": list(marks),
        "keywords": ["t.py", "dir"] if keywords is None else keywords,
        "adapter": None,
        "expected": [],
    }


def report(*cases, fingerprint=FP, **selection):
    env = {"machine_class": "cpu", "fingerprint": fingerprint,
           "selection": {"paths": ["."], **selection}}  # fmt: skip
    return build_report(list(cases), env, 1.0)


def names(result, category):
    return [nodeid for nodeid, _ in result.items[category]]


def test_case_key_is_the_file_stem_and_the_test():
    assert case_key("suites/conformance/test_attention.py::test_core[bf16-a::b]") == (
        "test_attention::test_core[bf16-a::b]"
    )
    # the same case installed elsewhere, or moved to another folder, keeps its key
    installed = "../site-packages/suites/conformance/test_attention.py::test_core[bf16-a::b]"
    assert case_key(installed) == (
        "test_attention::test_core[bf16-a::b]"
    )
    assert case_key("suites/conformance/test_attention.py::T::test_x") == (
        "test_attention::T::test_x"
    )


def test_ratio_growth_gates_only_against_the_same_fingerprint():
    """An fp32 case whose worst ratio grew 0.16 -> 0.42 on another CPU's kernels (the AVX2
    report of the verdict issue) is drift there, a regression on the same machine."""
    base = report(case("t.py::test_a[fp32]", ratio=0.16), case("t.py::test_b", ratio=0.3))
    grown = [case("t.py::test_a[fp32]", ratio=0.42), case("t.py::test_b", ratio=0.1)]
    same = compare(report(*grown), base)
    assert names(same, "ratio_regressions") == ["t.py::test_a[fp32]"]
    assert same.regressions == 1 and same.same_machine
    other = compare(report(*grown, fingerprint=FP_AVX2), base)
    assert other.regressions == 0 and not other.same_machine
    assert names(other, "drift") == ["t.py::test_a[fp32]", "t.py::test_b"]
    assert "cpu_capability 'AVX512' -> 'AVX2'" in other.machine_note
    # outcomes gate whatever the machine
    failed = compare(report(case("t.py::test_a[fp32]", "failed", ratio=1.3), grown[1],
                            fingerprint=FP_AVX2), base)  # fmt: skip
    assert names(failed, "new_failures") == ["t.py::test_a[fp32]"]
    # a run or a baseline without a fingerprint matches none
    assert compare(report(*grown, fingerprint=None), base).regressions == 0


def test_a_tensor_no_longer_compared_is_lost_coverage():
    base = report(case("t.py::test_a", tensors=("out", "dq", "dk", "dv")))
    result = compare(report(case("t.py::test_a", tensors=("out", "dq"))), base)
    assert names(result, "lost_checks") == ["t.py::test_a"]
    assert "dk, dv" in result.items["lost_checks"][0][1]
    assert result.regressions == 1


def test_a_fuzz_case_that_draws_fewer_examples_is_lost_coverage(tmp_path):
    """TE_FUZZ_EXAMPLES=1 against a baseline made at the ci budget: the same case passes on
    one draw where the baseline drew 25. That is a regression, kept through the baseline file;
    more examples, or a case without a recorded budget on either side, are not."""
    fuzz = "suites/test_fuzz.py::test_fuzz_module[bshd-cpu]"
    base = report(case(fuzz, fuzz_examples=25))
    path = tmp_path / "base.json"
    B.write(B.from_report(base), path)
    for baseline in (base, B.load(path)):
        result = compare(report(case(fuzz, fuzz_examples=1)), baseline)
        assert names(result, "fewer_examples") == [fuzz]
        assert result.items["fewer_examples"][0][1] == "fuzz examples 25 -> 1"
        assert result.regressions == 1 and result.coverage_loss
        lost = compare(report(case(fuzz)), baseline)  # the budget no longer recorded
        assert lost.items["fewer_examples"][0][1] == "fuzz examples 25 -> none recorded"
        assert compare(report(case(fuzz, fuzz_examples=100)), baseline).regressions == 0
    assert compare(report(case(fuzz, fuzz_examples=1)), report(case(fuzz))).regressions == 0


def test_an_impl_run_answers_for_the_conformance_cases_of_the_default_baseline():
    """--impl is pytest's -m conformance (joined with the run's own -m), so a run of --impl
    te_fast against the default run's baseline is a subset run: te_fast's own tests and the
    judge's are not compared, a conformance case that vanished is missing."""
    from te_conformance.suites.plugin import select_conformance

    class Option:
        markexpr = "not gpu"

    class Config:
        option = Option()

    config = Config()
    select_conformance(config)
    select_conformance(config)  # an xdist worker configures again: applied once
    assert config.option.markexpr == "(not gpu) and conformance"
    conf = "suites/conformance/test_attention.py::test_core[x]"
    gone = "suites/conformance/test_attention.py::test_core[y]"
    own = "suites/te_fast/test_ops.py::test_softmax[x]"
    base = report(case(conf, marks=["conformance"]), case(gone, marks=["conformance"]),
                  case(own, marks=[]))  # fmt: skip
    new = report(case(conf, marks=["conformance"]), markexpr="(not gpu) and conformance")
    result = compare(new, base)
    assert not result.scope.complete and result.not_compared == 1
    assert [n for n, _ in result.items["missing"]] == [gone]


def _kw_case(param, dtype):
    nodeid = f"suites/test_x.py::test_attn[{param}]"
    return case(nodeid, marks=["gpu"] if "cuda" in param else [],
                keywords=["suites", "test_x.py", "parametrize"])  # fmt: skip


PARAMS = ["bf16-cpu", "fp16-cpu", "bf16-cuda", "fp16-cuda"]


def test_a_subset_run_answers_for_the_baseline_cases_it_selects():
    """-k bf16 selects two baseline cases: one vanished from the run is missing; fp16's are not
    selected, so not missing."""
    base = report(*(_kw_case(p, p) for p in PARAMS))
    ran = [_kw_case("bf16-cuda", "")]  # bf16-cpu vanished
    result = compare(report(*ran, keyword="bf16"), base)
    assert names(result, "missing") == ["suites/test_x.py::test_attn[bf16-cpu]"]
    assert result.not_compared == 2 and result.regressions == 1
    # -m, -k together, and not
    result = compare(report(keyword="not fp16", markexpr="not gpu"), base)
    assert names(result, "missing") == ["suites/test_x.py::test_attn[bf16-cpu]"]
    # -k matches the recorded keywords too (the file name), case-insensitively
    assert len(compare(report(keyword="TEST_X"), base).items["missing"]) == 4
    # --deselect and a path
    result = compare(report(paths=["suites/test_x.py"],
                            deselect=["suites/test_x.py::test_attn[bf16"]), base)  # fmt: skip
    assert names(result, "missing") == [f"suites/test_x.py::test_attn[fp16-{d}]"
                                        for d in ("cpu", "cuda")]  # fmt: skip


def test_a_shard_answers_for_its_share_of_the_baseline():
    base = report(*(_kw_case(p, p) for p in PARAMS))
    keys = {p: case_key(f"suites/test_x.py::test_attn[{p}]") for p in PARAMS}
    mine = sorted(p for p in PARAMS if in_shard(keys[p], 1, 2))
    new = report()
    new["environment"]["shard"] = "1/2"
    result = compare(new, base)
    assert names(result, "missing") == [f"suites/test_x.py::test_attn[{p}]" for p in mine]


def test_a_selection_that_cannot_be_applied_compares_what_ran():
    base = report(*(_kw_case(p, p) for p in PARAMS))
    result = compare(report(_kw_case("bf16-cpu", ""), last_failed=True), base)
    assert result.regressions == 0 and result.not_compared == 3
    assert "--lf" in run_scope(report(last_failed=True)).describe()
    # a baseline that recorded no keywords cannot answer -k: what ran is compared
    old = report(*(case(f"suites/test_x.py::test_attn[{p}]", keywords=None) for p in PARAMS))
    for c in old["cases"]:
        c["keywords"] = None
    assert compare(report(keyword="bf16"), old).regressions == 0


def test_compact_baseline_round_trip(tmp_path):
    rep = report(
        case("suites/test_x.py::test_a[1]", ratio=0.25, marks=["slow"]),
        case("suites/test_x.py::test_a[2]", "skipped", ratio=None, reason="no GPU"),
        case("suites/test_y.py::test_b", "xfailed", ratio=None, reason="known failure: dk"),
        case("suites/test_y.py::test_c", "failed", ratio=2.0),
    )
    b = B.from_report(rep)
    path = tmp_path / "cpu.json"
    B.write(b, path)
    text = path.read_text()
    assert "Traceback" not in text and "duration" not in text and "no GPU" not in text
    lines = text.splitlines()
    assert sum('"outcome"' in line for line in lines) == 4  # a case a line
    loaded = B.load(path)
    # a skip's reason is the new run's to say; an xfail's is kept
    assert loaded.entries["test_x::test_a[2]"].reason is None
    assert {k: e for k, e in loaded.entries.items() if k != "test_x::test_a[2]"} == {
        k: e for k, e in b.entries.items() if k != "test_x::test_a[2]"}
    assert loaded.fingerprint == FP
    assert loaded.entries["test_y::test_b"].reason == "known failure: dk"
    assert loaded.entries["test_x::test_a[1]"].nodeid == "suites/test_x.py::test_a[1]"
    assert compare(rep, loaded).regressions == 0
    json.loads(text)  # plain JSON


def test_the_rename_map_carries_moved_tests(tmp_path):
    path = tmp_path / "cpu.json"
    B.write(B.from_report(report(case("suites/test_x.py::test_old[1]"),
                                 case("suites/test_x.py::test_old[2]"))), path)  # fmt: skip
    new = report(case("suites/test_x.py::test_new[1]"), case("suites/test_x.py::test_new[2]"))
    assert len(compare(new, B.load(path)).items["missing"]) == 2
    assert main(["rename", str(path), "test_x::test_old", "test_x::test_new"]) == 0
    result = compare(new, B.load(path))
    assert result.regressions == 0 and not result.items["new_cases"]
    assert B.load(path).renames == {"test_x::test_old": "test_x::test_new"}
    with pytest.raises(ReportError, match="no case has the key"):
        B.add_rename(path, "test_x::test_gone", "test_x::test_new")


def test_a_test_moved_to_another_file_takes_that_files_path(tmp_path):
    """A rename across files (a test split out of its file into a room of its own): where the
    baseline knows the new file, the moved cases' node ids are under it, so that a run of that
    file alone still answers for them (a vanished case there is missing)."""
    path = tmp_path / "cpu.json"
    B.write(B.from_report(report(case("suites/test_x.py::test_old[1]"),
                                 case("suites/room/test_y.py::test_kept"))), path)  # fmt: skip
    assert main(["rename", str(path), "test_x::test_old", "test_y::test_old"]) == 0
    (entry,) = [e for e in B.load(path).entries.values() if e.key == "test_y::test_old[1]"]
    assert entry.nodeid == "suites/room/test_y.py::test_old[1]"
    scoped = report(case("suites/room/test_y.py::test_kept"))
    scoped["environment"]["selection"] = {"paths": ["suites/room/test_y.py"]}
    missing = compare(scoped, B.load(path)).items["missing"]
    assert [nodeid for nodeid, _ in missing] == ["suites/room/test_y.py::test_old[1]"]


def test_update_baseline_writes_the_compact_form(tmp_path):
    new, base = tmp_path / "new.json", tmp_path / "base.json"
    write_report(report(case("suites/test_x.py::test_a")), new)
    assert main(["compare", str(new), str(base), "--update-baseline"]) == 0
    data = json.loads(base.read_text())
    assert data["schema"] == B.SCHEMA and data["fingerprint"] == FP
    assert list(data["cases"]) == ["test_x::test_a"]
    # a whole report still reads as a baseline
    assert main(["compare", str(new), str(new)]) == 0


def test_a_subset_run_with_a_case_removed_fails_naming_it(tmp_path):
    """The issue's check, end to end through the command line: a -k run's report compared with
    itself less one passed case FAILs (exit 1) and names the case as missing."""
    tiny = tmp_path / "test_tiny.py"
    tiny.write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('dtype', ['bf16', 'fp16', 'fp32'])\n"
        "@pytest.mark.parametrize('op', ['softmax_fwd', 'softmax_bwd'])\n"
        "def test_op(op, dtype):\n    pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "pytest", "-p", "te_conformance.reports.plugin", "-p",
           "no:cacheprovider", "-q", "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"),
           "--te-report", str(out), "-k", "softmax and fwd", str(tiny)]  # fmt: skip
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    full = json.loads(out.read_text())
    assert full["environment"]["selection"]["keyword"] == "softmax and fwd"
    assert len(full["cases"]) == 3 and all(c["keywords"] for c in full["cases"])
    assert all("parametrize" in c["marks"] for c in full["cases"])
    gone = full["cases"].pop(0)["nodeid"]
    less = tmp_path / "less.json"
    less.write_text(json.dumps(full))
    proc = subprocess.run([sys.executable, "-m", "te_conformance", "compare", str(less), str(out)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    assert "missing cases" in proc.stdout and gone in proc.stdout


def test_update_baseline_refuses_a_run_that_compares_fewer_tensors(tmp_path, capsys):
    """A tensor no longer compared is lost coverage: --update-baseline refuses it without
    --accept-loss, as it refuses passed -> skipped and missing cases."""
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    B.write(B.from_report(report(case("suites/test_x.py::test_a",
                                      tensors=("out", "dq", "dk", "dv")))), base)  # fmt: skip
    write_report(report(case("suites/test_x.py::test_a", tensors=("out",))), new)
    before = base.read_text()
    assert main(["compare", str(new), str(base), "--update-baseline"]) == 1
    assert "lost coverage of 1 baseline case(s)" in capsys.readouterr().out
    assert base.read_text() == before
    assert main(["compare", str(new), str(base), "--update-baseline",
                 "--accept-loss", "dk, dv judged elsewhere now"]) == 0  # fmt: skip
    assert B.load(base).accepted_loss["cases"] == [
        "suites/test_x.py::test_a: no longer compared: dk, dq, dv"
    ]
