"""The release verdict: every input alone and the combinations where the rules interact."""

from __future__ import annotations

import dataclasses

import pytest

from te_conformance.reports.verdict import Verdict

BASE = "reports/baseline/cpu.json"

CASES = {
    # name: (inputs, exit code, reasons)
    "all_clear": ({}, 0, []),
    "failing_cases": (dict(failing=3, pytest_exit=1), 1, ["3 failing case(s)"]),
    "pytest_1_without_failing_cases": (dict(pytest_exit=1), 1, ["pytest exited with code 1"]),
    "interrupted": (dict(pytest_exit=2), 2, ["pytest exited with code 2"]),
    "no_tests_ran": (dict(pytest_exit=5), 5, ["pytest exited with code 5"]),
    "interrupted_after_failures": (
        dict(failing=1, pytest_exit=2), 1, ["1 failing case(s)", "pytest exited with code 2"],
    ),
    "stopped_by_sigterm": (
        dict(pytest_exit=2, interrupted="SIGTERM", reported=20, collected=40), 2,
        ["stopped early (SIGTERM): the report is partial, 20 case(s) of 40 collected"],
    ),
    "stopped_after_failures": (
        dict(failing=2, pytest_exit=2, interrupted="SIGTERM", reported=7), 1,
        ["stopped early (SIGTERM): the report is partial, 7 case(s)", "2 failing case(s)"],
    ),
    "stopped_though_pytest_said_0": (
        dict(interrupted="KeyboardInterrupt", reported=3, collected=3), 2,
        ["stopped early (KeyboardInterrupt): the report is partial, 3 case(s) of 3 collected"],
    ),
    "regressions": (dict(regressions=2), 1, [f"2 regression(s) against {BASE}"]),
    "refused_update": (dict(baseline_refused=True), 1, ["baseline not updated"]),
    "no_baseline": (dict(no_baseline=True, passing=4), 0, []),  # a first run: NO BASELINE
    "unusable_baseline": (dict(unusable_baseline=True), 2, [f"unusable baseline {BASE}"]),
    "no_baseline_and_failing": (
        dict(failing=1, pytest_exit=1, no_baseline=True), 1, ["1 failing case(s)"],
    ),
    "no_baseline_and_no_tests": (
        dict(pytest_exit=5, no_baseline=True), 5, ["pytest exited with code 5"],
    ),
    "accepted_loss": (dict(overrides=("--accept-loss: 2 case(s) ...: moved",)), 0, []),
    # issue 46: --no-compare with 3078 of 3078 skipped, or a GPU run whose kernels did not load
    "all_skipped": (
        dict(reported=3078, skipped=3078), 1,
        ["every one of the 3078 case(s) was skipped: nothing was judged"],
    ),
    "all_skipped_no_baseline": (
        dict(reported=2583, skipped=2583, no_baseline=True), 1,
        ["every one of the 2583 case(s) was skipped: nothing was judged"],
    ),
    "one_judged_case": (dict(reported=5, skipped=4, passing=1), 0, []),
    "everything": (
        dict(failing=1, pytest_exit=1, regressions=4, baseline_refused=True,
             unusable_baseline=True), 1,
        ["1 failing case(s)", f"4 regression(s) against {BASE}", "baseline not updated",
         f"unusable baseline {BASE}"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_verdict(name):
    inputs, exit_code, reasons = CASES[name]
    verdict = Verdict(baseline=BASE, **inputs)
    assert (verdict.passed, verdict.exit_code, verdict.reasons) == (not reasons, exit_code, reasons)


def test_passes_only_with_exit_code_0():
    for inputs, _, _ in CASES.values():
        verdict = Verdict(**inputs)
        assert verdict.passed == (verdict.exit_code == 0), inputs


def test_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Verdict().failing = 1


def test_status_notes_and_what_report_json_stores():
    first = Verdict(baseline=BASE, no_baseline=True, passing=4, run_kind="full")
    assert (first.status, first.exit_code) == ("NO BASELINE", 0)
    assert first.notes == ["no baseline: 4 passed, 0 failed"]
    assert Verdict(no_baseline=True, failing=2, pytest_exit=1).status == "FAIL"
    accepted = Verdict(overrides=("--accept-loss: 2 case(s) of lost coverage accepted: moved",))
    stored = accepted.as_dict()
    assert stored["status"] == "PASS" and stored["exit_code"] == 0
    assert stored["overrides"] == ["--accept-loss: 2 case(s) of lost coverage accepted: moved"]
    assert stored["notes"] == ["overridden: --accept-loss: 2 case(s) of lost coverage accepted: "
                               "moved"]  # fmt: skip
    assert Verdict(regressions=1, baseline=BASE).as_dict()["reasons"] == [
        f"1 regression(s) against {BASE}"
    ]
