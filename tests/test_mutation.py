"""The mutation harness (tools/mutation/) and its catalogue: every planted defect still matches
the tree exactly once, and the harness tells a caught defect from a survivor, an error and a
defect it cannot run, on a toy project small enough for CI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from te_conformance.reports.model import build_report
from te_conformance.reports.render import MUTATION_FILE, render
from tools.mutation import harness as mut
from tools.mutation.catalogue import (
    BY_NAME,
    DEFECTS,
    DEVICES,
    KNOWN_GAPS,
    SUITES,
    Defect,
    SuiteSet,
)

ROOT = Path(__file__).resolve().parents[1]
ISSUE_GAPS = (
    "dropout_in_eval",
    "alias_one_token",
    "recompile_guard_on_length",
    "causal_kernel_alignment_swap",
)


# ----------------------------------------------------------------------------- the catalogue


def test_catalogue_has_at_least_thirty_uniquely_named_defects():
    names = [d.name for d in DEFECTS]
    assert len(names) >= 30
    assert len(set(names)) == len(names), "defect names must be unique"
    assert all(re.fullmatch(r"[a-z0-9_]+", n) for n in names), names
    assert {d.device for d in DEFECTS} == set(DEVICES)


@pytest.mark.parametrize("defect", DEFECTS, ids=lambda d: d.name)
def test_defect_matches_the_tree_exactly_once(defect: Defect):
    """The old text occurs once in the current file (an edit that moves it fails here, not in a
    long mutation run); the defect changes something and a Python one still compiles."""
    path = ROOT / defect.path
    assert path.is_file(), f"{defect.path} does not exist"
    text = path.read_text()
    count = text.count(defect.old)
    assert count == 1, f"{defect.name}: the old text occurs {count} times in {defect.path}"
    assert defect.new != defect.old
    if not defect.native:  # compiles, and reads no name the code lacks (a NameError kills all)
        mutated = text.replace(defect.old, defect.new)
        assert mut.python_defect_problem(text, mutated, defect.path) is None


@pytest.mark.parametrize("defect", DEFECTS, ids=lambda d: d.name)
def test_defect_is_well_formed(defect: Defect):
    assert defect.device in DEVICES
    assert defect.description and "\n" not in defect.description
    # csrc/cuda/ is judged by the GPU cases; the Python and shared C++ run on the CPU
    assert (defect.device == "cuda") == defect.path.startswith("csrc/cuda/"), defect.path
    assert defect.suites, "a defect names the suite files to run first"
    for path in defect.suites:
        assert (ROOT / path.split("::")[0]).exists(), path


def test_known_gaps_are_catalogued_with_reasons():
    assert set(ISSUE_GAPS) <= set(BY_NAME), "the issue's four known gaps are defects here"
    for name, reason in KNOWN_GAPS.items():
        assert name in BY_NAME, f"known gap {name} is not in the catalogue"
        assert len(reason) > 40, f"known gap {name} needs a reason"


def test_suite_sets_exist():
    for device in DEVICES:
        suite = SUITES[device]
        for path in (*suite.paths, *suite.ignore):
            assert (ROOT / path).exists(), path
        assert suite.marker


def test_list_prints_one_line_per_defect():
    out = subprocess.run(
        [sys.executable, "-m", "tools.mutation", "--list"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert len(out) == len(DEFECTS)
    for line, defect in zip(out, DEFECTS):
        name, device, *_ = line.split()
        assert (name, device) == (defect.name, defect.device)
        assert defect.description in line
        assert ("[known gap]" in line) == (defect.name in KNOWN_GAPS)


def test_unknown_defect_name_is_a_usage_error(capsys):
    assert mut.main(["--only", "no_such_defect", "--list"]) == 2
    assert "no_such_defect" in capsys.readouterr().err


# ----------------------------------------------------------------------------- pytest output


def test_first_failure_is_read_from_the_short_summary():
    output = "\n".join([
        "F.",
        "ERROR root: a log line that looks like a summary line",
        "=========================== short test summary info ============================",
        "FAILED suites/test_a.py::test_x[cpu-fp32] - AssertionError: out: max 3 > bound",
        "ERROR suites/test_b.py::test_y - RuntimeError: boom",
        "1 failed, 1 error in 0.1s",
    ])  # fmt: skip
    run = mut.PytestRun(1, output, 0.1)
    assert run.first_failure() == "suites/test_a.py::test_x[cpu-fp32]"
    assert mut.summary_ids(output, ("ERROR",)) == ["suites/test_b.py::test_y"]
    collect = "==== short test summary info ====\nERROR suites/test_c.py - ImportError: x\n"
    assert mut.PytestRun(2, collect, 0.1).first_failure() == "suites/test_c.py"
    assert mut.PytestRun(0, "1 passed", 0.1).first_failure() is None
    # a failure whose message quotes another pytest run (tests/test_expected.py runs one):
    # its indented summary is not the run's
    quoting = "\n".join([
        "=========================== short test summary info ============================",
        "FAILED tests/test_e.py::test_z - AssertionError: ==== test session starts ====",
        "  ==== short test summary info ====",
        "  FAILED test_cases.py::test_passes - [XPASS(strict)]",
        "1 failed in 0.1s",
    ])  # fmt: skip
    assert mut.PytestRun(1, quoting, 0.1).first_failure() == "tests/test_e.py::test_z"


# ----------------------------------------------------------------------------- a toy project

TOY_CODE = "def add(a, b):\n    return a + b\n\n\ndef unused():\n    return 1\n"
TOY_TEST = (
    "from calc import add\n\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_add_zero():\n    assert add(0, 0) == 0\n"
)
BROKEN_TEST = "def test_always_fails():\n    assert False, 'fails with or without a defect'\n"

CAUGHT_DEFECT = Defect(
    "add_subtracts", "cpu", "calc.py", "return a + b", "return a - b", "subtracts",
    ("test_calc.py",),
)  # fmt: skip
SURVIVOR = Defect(
    "unused_changed", "cpu", "calc.py", "return 1", "return 2", "no test calls it",
    ("test_calc.py",),
)  # fmt: skip
STALE = Defect(
    "stale_text", "cpu", "calc.py", "return a * b", "return 0", "the code moved on",
    ("test_calc.py",),
)  # fmt: skip
GPU_ONLY = Defect(
    "gpu_only", "cuda", "calc.py", "return 1", "return 3", "needs a GPU", ("test_calc.py",)
)
BLAMED = Defect(
    "blamed_for_a_broken_test", "cpu", "calc.py", "return 1", "return 4",
    "killed only by a test that always fails", ("test_broken.py",),
)  # fmt: skip
SYNTAX = Defect(
    "does_not_compile", "cpu", "calc.py", "return a + b", "return a +", "a syntax error",
    ("test_calc.py",),
)  # fmt: skip
UNDEFINED = Defect(
    "reads_a_lost_name", "cpu", "calc.py", "return a + b", "return a + c", "c is no name here",
    ("test_calc.py",),
)  # fmt: skip


def _toy(tmp_path: Path) -> mut.Project:
    root = tmp_path / "toy"
    root.mkdir()
    (root / "calc.py").write_text(TOY_CODE)
    (root / "test_calc.py").write_text(TOY_TEST)
    (root / "test_broken.py").write_text(BROKEN_TEST)
    (root / "pytest.ini").write_text("[pytest]\n")  # the toy is its own pytest root
    suites = {d: SuiteSet(("test_calc.py",), "not gpu") for d in DEVICES}
    return mut.Project(root, suites, extension=False)


def _run(tmp_path, defects, known_gaps=None, devices=("cpu",), jobs=1, on_outcome=None):
    project = _toy(tmp_path)
    outcomes = mut.run_mutations(
        project, defects, devices=devices, jobs=jobs, log_dir=tmp_path / "logs",
        scratch=tmp_path, known_gaps=known_gaps or {}, progress=lambda line: None,
        on_outcome=on_outcome,
    )  # fmt: skip
    assert (project.root / "calc.py").read_text() == TOY_CODE, "the source tree was changed"
    return {o.name: o for o in outcomes}, outcomes


def test_harness_tells_caught_from_survived_error_and_not_run(tmp_path):
    defects = [CAUGHT_DEFECT, SURVIVOR, STALE, GPU_ONLY, SYNTAX, UNDEFINED]
    by, outcomes = _run(tmp_path, defects, jobs=2)
    assert by["add_subtracts"].result == mut.CAUGHT
    assert by["add_subtracts"].test == "test_calc.py::test_add"
    assert by["add_subtracts"].stage == mut.FIRST
    assert by["unused_changed"].result == mut.SURVIVED
    assert by["unused_changed"].stage == mut.FULL  # confirmed by the whole suite set
    assert by["stale_text"].result == mut.ERROR
    assert "occurs 0 times" in by["stale_text"].detail
    assert by["does_not_compile"].result == mut.ERROR
    assert "does not compile" in by["does_not_compile"].detail
    assert by["reads_a_lost_name"].result == mut.ERROR  # not a kill by NameError
    assert "undefined names: c" in by["reads_a_lost_name"].detail
    assert by["gpu_only"].result == mut.NOT_RUN  # never counted as caught
    assert [o.name for o in outcomes] == [d.name for d in defects]
    status, reasons = mut.verdict(outcomes)
    assert status == 1
    assert any("unused_changed" in r for r in reasons)
    assert any("stale_text" in r for r in reasons)
    log = Path(by["add_subtracts"].log).read_text()
    assert "return a - b" in log and "CAUGHT" in log


def test_a_survivor_listed_as_known_gap_passes(tmp_path):
    partial: list[list[str]] = []
    by, outcomes = _run(
        tmp_path, [CAUGHT_DEFECT, SURVIVOR], known_gaps={"unused_changed": "why"},
        on_outcome=lambda done: partial.append([o.name for o in done]),
    )  # fmt: skip
    assert partial == [["add_subtracts"], ["add_subtracts", "unused_changed"]]  # after each one
    assert by["unused_changed"].result == mut.SURVIVED
    assert by["unused_changed"].known_gap == "why"
    assert mut.verdict(outcomes) == (0, [])
    matrix = mut.kill_matrix(outcomes, {}, 1.0)
    assert matrix["exit_status"] == 0 and matrix["counts"][mut.SURVIVED] == 1


def test_a_kill_by_a_test_that_fails_anyway_is_an_error(tmp_path):
    by, outcomes = _run(tmp_path, [BLAMED])
    assert by["blamed_for_a_broken_test"].result == mut.ERROR
    assert "does not pass without the defect" in by["blamed_for_a_broken_test"].detail
    assert mut.verdict(outcomes)[0] == 1


def test_scratch_and_logs_inside_the_tree_are_not_copied(tmp_path):
    project = _toy(tmp_path)
    (project.root / "tmp").mkdir()
    outcomes = mut.run_mutations(
        project, [CAUGHT_DEFECT], devices=("cpu",), log_dir=project.root / "logs",
        scratch=project.root / "tmp", known_gaps={}, progress=lambda line: None,
    )  # fmt: skip
    assert outcomes[0].result == mut.CAUGHT, outcomes[0].detail


def test_nothing_run_is_its_own_exit_status(tmp_path):
    _, outcomes = _run(tmp_path, [GPU_ONLY])
    assert mut.verdict(outcomes)[0] == 2


# ----------------------------------------------------------------------------- the report


def test_kill_matrix_joins_the_report(tmp_path):
    outcomes = [
        mut.Outcome("a_defect", "cpu", "x.py", "breaks a", mut.CAUGHT, test="t.py::test_a"),
        mut.Outcome("b_defect", "cpu", "x.py", "breaks b", mut.SURVIVED, known_gap="a reason"),
        mut.Outcome("c_defect", "cuda", "y.cu", "breaks c", mut.NOT_RUN, detail="no cuda device"),
    ]
    matrix = mut.kill_matrix(outcomes, {"device": "all"}, 12.5)
    js, md = mut.write_outputs(matrix, tmp_path)
    assert js.name == MUTATION_FILE
    text = md.read_text()
    assert "Mutation kill matrix" in text and "t.py::test_a" in text
    assert "SURVIVED (known gap)" in text and "a reason" in text and "NOT RUN" in text

    report = build_report([], {"machine_class": "cpu"}, 1.0)
    report_md, report_html = render(report, tmp_path)
    assert "## Mutation kill matrix" in report_md.read_text()
    page = report_html.read_text()
    assert "<h2>Mutation kill matrix</h2>" in page and "t.py::test_a" in page
    (tmp_path / MUTATION_FILE).unlink()
    report_md, _ = render(report, tmp_path)
    assert "Mutation kill matrix" not in report_md.read_text()
