"""suites/known_failures.py: every entry names a test that exists (a renamed test must not leave
a stale entry behind), and the suites' plugin marks exactly those xfail, strict and narrow: the
xfail counts only when the named tensor fails its SPEC §6 ratio assertion and nothing else."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suites.checks.numerics import (
    CheckError,
    RatioError,
    ratio_error,
    ratio_errors,
    value_failures,
)
from suites.known_failures import KNOWN_FAILURES, KnownFailure

ROOT = Path(__file__).resolve().parents[1]


def test_every_known_failure_is_a_collected_test():
    files = sorted({nodeid.split("::")[0] for nodeid in KNOWN_FAILURES})
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "--impl", "te_fast", "--impl", "flex_attention", *files],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    collected = set(out.stdout.split())
    missing = [n for n in KNOWN_FAILURES if n not in collected]
    assert not missing, f"known failures that are no test: {missing}\n{out.stdout[-2000:]}"


def test_known_failures_run_as_strict_narrow_xfails():
    from suites import plugin

    class Item:
        def __init__(self, nodeid):
            self.nodeid, self.marks, self.user_properties = nodeid, [], []
            self.name = nodeid.rpartition("::")[2]

        def add_marker(self, mark):
            self.marks.append(mark)

    items = [Item(n) for n in KNOWN_FAILURES] + [Item("suites/test_ops.py::test_other")]
    plugin.pytest_collection_modifyitems(None, items)
    for item, known in zip(items, KNOWN_FAILURES.values()):
        (mark,) = item.marks
        # strict and exact, but for another implementation's rounding that moves with the CPU
        assert mark.name == "xfail" and mark.kwargs["strict"] is (not known.machine_dependent)
        if known.machine_dependent:
            assert "flex_attention" in item.nodeid and "rounding" in known.reason
            assert mark.kwargs["raises"] is value_failures(known.tensors)
        else:
            assert mark.kwargs["raises"] is ratio_errors(known.tensors)
        assert mark.kwargs["reason"].startswith(f"known failure: {known.tensor} ")
        # recorded for the report, with where the entry is (reports.record.expected_on)
        ((key, payload),) = item.user_properties
        assert payload["kind"] == "expected" and payload["source"] == "known_failure"
        assert payload["tensors"] == list(known.tensors) and payload["reason"] == known.reason
        path, _, line = payload["defined_at"].partition(":")
        assert path == "suites/known_failures.py" and line.isdigit()
        source = (ROOT / path).read_text().splitlines()[int(line) - 1]
        assert item.nodeid.partition("[")[2] in source  # the line names the entry's parameters
    assert not items[-1].marks and not items[-1].user_properties


def test_each_tensor_and_check_has_its_own_class():
    dk = ratio_error("dk")
    assert dk is ratio_error("dk") and issubclass(dk, RatioError)
    assert issubclass(dk, AssertionError) and dk.tensor == "dk" and dk.kind == "ratio"
    assert not issubclass(ratio_error("dq"), dk) and not issubclass(dk, ratio_error("dq"))
    assert not issubclass(CheckError.of("zero_rows", "dk"), dk)
    assert KnownFailure("dk", "why").raises is dk


# The plugin on a test file of its own, with known failures recorded for its tests: the outcome
# pytest reports for each (-rA short summary).
CASES = '''
import torch

from suites.checks.numerics import CheckError, check_ratio, raise_failures


def fail_ratio(name):
    check_ratio(name, torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0]), 2.0)


def ratio_failure(name):
    try:
        fail_ratio(name)
    except AssertionError as e:
        return e


def test_named_tensor():
    fail_ratio("dk")


def test_named_tensor_in_ops_order():  # as test_ops: y is judged first, and passes
    check_ratio("y", torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([1.0]), 2.0)
    fail_ratio("dx")


def test_other_tensor():
    fail_ratio("dq")


def test_named_and_other_tensor():  # judge()'s way of raising two failures
    raise_failures([ratio_failure("dk"), ratio_failure("dv")])


def test_named_tensor_other_check():
    raise CheckError.new("zero_rows", "dk", "dk: 1 rows that are exactly 0 ... are not")


def test_plain_assertion():
    assert False, "dk: something else"


def test_run_error():
    raise RuntimeError("dk: the op failed")


def test_passes():
    pass
'''

EXPECTED = {
    "test_named_tensor": "XFAIL",
    "test_named_tensor_in_ops_order": "XFAIL",
    "test_other_tensor": "FAILED",
    "test_named_and_other_tensor": "FAILED",
    "test_named_tensor_other_check": "FAILED",
    "test_plain_assertion": "FAILED",
    "test_run_error": "FAILED",
    "test_passes": "FAILED",  # XPASS(strict)
}


def test_only_the_named_tensors_ratio_failure_counts(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    entries = {
        f"test_cases.py::{name}": ("dx" if "ops_order" in name else "dk") for name in EXPECTED
    }
    (tmp_path / "conftest.py").write_text(
        "from suites.known_failures import KNOWN_FAILURES, KnownFailure\n\n"
        f"for nodeid, tensor in {entries!r}.items():\n"
        "    KNOWN_FAILURES[nodeid] = KnownFailure(tensor, 'recorded for the test')\n\n"
        "pytest_plugins = ['suites.plugin']\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA",
         "-o", "addopts=", "test_cases.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    line = re.compile(r"^(?P<outcome>[A-Z]+) test_cases\.py::(?P<name>\w+)", re.M)
    got = {m["name"]: m["outcome"] for m in line.finditer(out.stdout)}
    assert got == EXPECTED, out.stdout[-4000:] + out.stderr[-2000:]
    assert "[XPASS(strict)] known failure: dk" in out.stdout, out.stdout[-3000:]


@pytest.mark.parametrize("known", list(KNOWN_FAILURES.values()))
def test_entries_name_a_tensor(known):
    assert all(re.fullmatch(r"[a-z_]+", t) for t in known.tensors), known
    assert list(known.tensors) == sorted(set(known.tensors)), known


def test_several_tensors_expect_exactly_those():
    """An entry naming "dk,dq" expects a judgement that failed on dk and dq and nothing else."""
    from suites.checks.numerics import CheckError, JudgementError, raise_failures, ratio_errors

    def judged(*tensors):
        try:
            raise_failures([CheckError.new("ratio", t, f"{t}: over") for t in tensors])
        except AssertionError as e:
            return e
        raise AssertionError("raise_failures raised nothing")

    want = ratio_errors(("dk", "dq"))
    assert isinstance(judged("dq", "dk"), want)
    assert not isinstance(judged("dk", "dq", "dv"), want)
    assert not isinstance(judged("dq"), want)
    assert not isinstance(judged("dk", "dq", "dv"), ratio_errors(("dk", "dv")))
    assert isinstance(judged("dq"), ratio_errors(("dq",)))
    assert issubclass(want, JudgementError)


# ------------------------------------------------------------------ TE deviations: strict, narrow


def _judged_case(return_max_logit=False):
    import torch

    from suites.adapters import ADAPTERS
    from suites.cases import AttnCase, make_inputs
    from suites.checks.attention import run_impl

    case = AttnCase("bshd_bshd_bshd", "fp32", "causal", device="cpu", b=1, sq=4, skv=4, h=2,
                    hg=2, d=4, dv=4, return_max_logit=return_max_logit)  # fmt: skip
    adapter = ADAPTERS["te_fast"]
    inputs = make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
    impl = run_impl(adapter, adapter.build(case, case.d**-0.5), case, inputs)
    return case, inputs, impl


class _Recorded:
    """An adapter whose recorded deviations are ``deviations`` for every case."""

    def __init__(self, *deviations):
        self.deviations = deviations

    def known_deviations(self, case, lengths=None, expected=None, call_kwargs=None):
        return self.deviations


def _outcome(deviations, case, inputs, impl) -> str:
    from suites.checks.attention import judge_with_deviations

    try:
        judge_with_deviations(_Recorded(*deviations), case, inputs, impl)
    except pytest.xfail.Exception:
        return "xfailed"
    except pytest.fail.Exception as e:
        return f"failed: {e}"
    except AssertionError as e:
        return f"failed: {e} | {' '.join(getattr(e, '__notes__', []))}"
    return "passed"


def test_te_deviations_are_strict_and_narrow():
    """A case a recorded TE deviation explains xfails only when it fails the value comparisons
    (ratio, exact zeros); M1 only by max_logit's dtype; a NaN, another check, or no failure at
    all fails the test."""
    import torch

    from suites.te_deviations import D1, M1

    case, inputs, impl = _judged_case()
    out, max_logit, grads = impl
    assert _outcome((), case, inputs, impl) == "passed"
    assert _outcome((D1,), case, inputs, impl).startswith("failed: deviation no longer shows")
    shifted = (out + 0.1, max_logit, grads)  # values differ, as a mask deviation makes them
    assert _outcome((D1,), case, inputs, shifted) == "xfailed"
    assert _outcome((M1,), case, inputs, shifted).startswith("failed: out: max |impl - ref64|")
    nan = out.clone()
    nan[0, 0, 0] = float("nan")
    got = _outcome((D1,), case, inputs, (nan, max_logit, grads))
    assert got.startswith("failed: ") and "not explained by the recorded deviations" in got
    assert "out has NaN" in got
    case, inputs, impl = _judged_case(return_max_logit=True)
    out, max_logit, grads = impl
    low = (out, max_logit.to(torch.bfloat16), grads)  # TE's max_logit in O's dtype
    assert _outcome((M1,), case, inputs, low) == "xfailed"
    assert _outcome((D1,), case, inputs, low).startswith("failed: max_logit dtype")


def test_unexplained_failures_of_a_judgement():
    from suites.checks.attention import unexplained_failures
    from suites.checks.numerics import JudgementError
    from suites.te_deviations import D1, M1

    ratio, zero = CheckError.new("ratio", "dk", "dk"), CheckError.new("zero_rows", "out", "out")
    nan, dtype = CheckError.new("nan", "dv", "dv"), CheckError.new("dtype", "max_logit", "ml")
    both = JudgementError([ratio, zero])
    assert unexplained_failures(both, (D1,)) == []
    assert unexplained_failures(JudgementError([ratio, nan]), (D1,)) == [nan]
    assert unexplained_failures(dtype, (M1,)) == []
    assert unexplained_failures(dtype, (D1,)) == [dtype]
    assert unexplained_failures(ratio, (M1,)) == [ratio]
    plain = AssertionError("dk: something")
    assert unexplained_failures(plain, (D1, M1)) == [plain]
    assert unexplained_failures(ratio, ("a reason string",)) == []  # the default: value checks
