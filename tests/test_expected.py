"""Expected outcomes, one mechanism (suites/expected.py), applied by one hook of the suites'
plugin: known failures (suites/known_failures.py, by case key), an adapter's declared differences
(suites/adapters/base.py Difference) and the deviations an adapter's per-case hook names (TE's,
suites/te_deviations.py) are STRICT and NARROW expected failures: the test must fail, and only by
the checks and tensors each explains; anything else fails, and so does a pass. Here on test files
of their own, with the outcome pytest reports for each test (-rA) and what each records for the
report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from te_conformance.suites.adapters.base import Adapter, Difference
from te_conformance.suites.cases import AttnCase
from te_conformance.suites.checks.numerics import CheckError, JudgementError, raise_failures
from te_conformance.suites.expected import Expectation, settle
from te_conformance.suites.known_failures import KNOWN_FAILURES

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, cases: str, conftest: str) -> tuple[dict[str, str], str]:
    """pytest on test_cases.py with the plugin: (outcome by test name (-rA), the output)."""
    (tmp_path / "test_cases.py").write_text(cases)
    (tmp_path / "conftest.py").write_text(conftest)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA",
         "-o", "addopts=", "test_cases.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    line = re.compile(r"^(?P<outcome>[A-Z]+) test_cases\.py::(?P<name>\S+)", re.M)
    return {m["name"]: m["outcome"] for m in line.finditer(out.stdout)}, out.stdout + out.stderr


# Records what each test's call phase reported for the report (its user properties).
RECORDING = '''

@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    if report.when == "call":
        found = os.path.exists("recorded.json")
        recorded = json.loads(open("recorded.json").read()) if found else {}
        recorded[report.nodeid.rpartition("::")[2]] = [p for _, p in report.user_properties]
        with open("recorded.json", "w") as f:
            json.dump(recorded, f)
'''


# ----------------------------------------------------------------------------- known failures


def test_every_known_failure_is_a_collected_test():
    """Each key names a case the suites collect: with the default adapter (every room) or with
    flex_attention's (the conformance room)."""
    from te_conformance.reports.model import case_key

    collected = set()
    for impl in ([], ["--impl", "flex_attention"]):
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             "-p", "no:xdist", *impl, "suites"],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        collected |= {case_key(n) for n in out.stdout.split() if "::" in n}
    missing = [k for k in KNOWN_FAILURES if k not in collected]
    assert not missing, f"known failures that are no test: {missing}"


def test_known_failures_are_strict_exact_ratio_expectations():
    for key, known in KNOWN_FAILURES.items():
        e = known.expectation(key)
        assert e.source == "known_failure" and e.id == key and e.reason == known.reason
        assert e.tensors == known.tensors
        assert 1.0 < e.max_ratio == known.max_ratio  # the ratios it explains, recorded
        if known.machine_dependent:  # another implementation's rounding that moves with the CPU
            assert "flex_attention" in key and "rounding" in known.reason
            assert not e.strict and not e.exact and e.checks == ("ratio", "zero_rows")
        else:
            assert e.strict and e.exact and e.checks == ("ratio",)
        path, _, line = e.defined_at.partition(":")
        assert path == "suites/known_failures.py" and line.isdigit()
        source = (ROOT / path).read_text().splitlines()[int(line) - 1]
        assert key.partition("[")[2] in source  # the line names the entry's parameters


CASES = '''
import torch

from te_conformance.suites.checks.numerics import CheckError, check_ratio, raise_failures


def fail_ratio(name):
    check_ratio(name, torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0]), 2.0)


def ratio_failure(name):
    try:
        fail_ratio(name)
    except AssertionError as e:
        return e


def test_named_tensor():
    fail_ratio("dk")


def test_named_tensor_past_its_range():  # its entry explains ratios up to 2: this is 5e8
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
    "test_named_tensor_past_its_range": "FAILED",
    "test_named_tensor_in_ops_order": "XFAIL",
    "test_other_tensor": "FAILED",
    "test_named_and_other_tensor": "FAILED",
    "test_named_tensor_other_check": "FAILED",
    "test_plain_assertion": "FAILED",
    "test_run_error": "FAILED",
    "test_passes": "FAILED",  # XPASS(strict)
}


def test_only_the_named_tensors_ratio_failure_counts(tmp_path):
    entries = {f"test_cases::{n}": ("dx" if "ops_order" in n else "dk",
                                    2.0 if "range" in n else 1e9) for n in EXPECTED}  # fmt: skip
    conftest = (
        "import json\nimport os\n\nimport pytest\n\n"
        "from te_conformance.suites.known_failures import KNOWN_FAILURES, KnownFailure\n\n"
        f"for key, (tensor, top) in {entries!r}.items():\n"
        "    KNOWN_FAILURES[key] = KnownFailure(tensor, 'recorded for the test', top)\n\n"
        "pytest_plugins = ['te_conformance.suites.plugin']\n" + RECORDING
    )
    got, log = _run(tmp_path, CASES, conftest)
    assert got == EXPECTED, log[-4000:]
    assert "[XPASS(strict)] the expected failure did not occur" in log, log[-3000:]
    assert "known failure (dk) [ratio <= 1e+09]: recorded for the test" in log, log[-3000:]
    recorded = json.loads((tmp_path / "recorded.json").read_text())
    (entry,) = [e for e in recorded["test_named_tensor"] if e.get("kind") == "expected"]
    assert entry["source"] == "known_failure" and entry["id"] == "test_cases::test_named_tensor"
    assert entry["tensors"] == ["dk"] and entry["outcome"] == "skipped"  # xfailed
    (failed,) = [e for e in recorded["test_other_tensor"] if e.get("kind") == "expected"]
    assert failed["outcome"] == "failed"


@pytest.mark.parametrize("known", list(KNOWN_FAILURES.values()))
def test_entries_name_a_tensor(known):
    assert all(re.fullmatch(r"[a-z_]+", t) for t in known.tensors), known
    assert list(known.tensors) == sorted(set(known.tensors)), known


def _judged(*tensors, kind="ratio"):
    try:
        raise_failures([CheckError.new(kind, t, f"{t}: over") for t in tensors])
    except AssertionError as e:
        return e
    raise AssertionError("raise_failures raised nothing")


def test_an_exact_expectation_wants_exactly_its_tensors():
    """A known failure naming "dk,dq" explains a judgement that failed on dk and dq and
    nothing else; a declared difference (not exact) any non-empty part of its tensors."""
    exact = Expectation("known_failure", "k", "why", checks=("ratio",), tensors=("dk", "dq"),
                        exact=True)  # fmt: skip
    assert settle([exact], _judged("dq", "dk")).outcome == "xfailed"
    assert settle([exact], _judged("dk", "dq", "dv")).outcome == "failed"
    assert settle([exact], _judged("dq")).outcome == "failed"
    assert settle([exact], _judged("dq", "dk", kind="zero_rows")).outcome == "failed"
    loose = Expectation("declared", "d", "why", tensors=("out", "dq"))
    assert settle([loose], _judged("dq")).outcome == "xfailed"
    assert settle([loose], _judged("out", kind="zero_rows")).outcome == "xfailed"
    assert settle([loose], _judged("dk")).outcome == "failed"
    assert settle([loose], _judged("out", kind="nan")).outcome == "failed"
    assert settle([loose], AssertionError("out")).outcome == "failed"
    assert settle([loose], RuntimeError("out")).outcome == "failed"
    both = JudgementError([CheckError.new("ratio", "out", "a"), AssertionError("contract")])
    assert settle([loose], both).outcome == "failed"


def test_a_pass_fails_unless_every_expectation_is_loose():
    strict = Expectation("declared", "d", "why", tensors=("out",))
    rounding = Expectation("known_failure", "k", "why", tensors=("dq",), strict=False)
    assert settle([strict], None).outcome == "failed"
    assert "[XPASS(strict)]" in settle([strict], None).why
    assert settle([rounding], None).outcome == "xpassed"
    assert settle([strict, rounding], None).outcome == "failed"
    assert settle([], None).outcome is None and settle([], _judged("dk")).outcome is None


# ----------------------------------------------------------------------------- declared


DECLARED_CASES = '''
import pytest
import torch

from te_conformance.suites.adapters.base import Adapter, Difference
from te_conformance.suites.cases import AttnCase
from te_conformance.suites.checks.numerics import CheckError, check_ratio, raise_failures


def ratio(name):
    try:
        check_ratio(name, torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.0]), 2.0)
    except AssertionError as e:
        return e
    raise AssertionError("check_ratio passed")


def zero_rows(name):
    return CheckError.new("zero_rows", name, f"{name}: 1 rows ... are not exactly 0")


class Declaring(Adapter):
    name = "declaring"
    differences = (
        Difference(test="test_value*", tensors=("out", "dq"), reason="rows differ",
                   where=lambda case: case.sq == 1),
        Difference(test="test_by_id", tensors="dk", reason="by id", ids="cpu-*"),
    )


class Plain(Adapter):
    name = "plain"


ONE = AttnCase("bshd_bshd_bshd", "fp32", "causal", device="cpu", sq=1, skv=5)
SQUARE = AttnCase("bshd_bshd_bshd", "fp32", "causal", device="cpu", sq=5, skv=5)
ADAPTERS = [pytest.param(Declaring(), id="declaring"), pytest.param(Plain(), id="plain")]
RAISE = {
    "ratio_out": lambda: ratio("out"),
    "zero_rows_dq": lambda: zero_rows("dq"),
    "both": lambda: raise_failures([ratio("out"), zero_rows("dq")]),
    "undeclared": lambda: ratio("dk"),
    "declared_and_undeclared": lambda: raise_failures([ratio("out"), ratio("dv")]),
    "other_check": lambda: CheckError.new("nan", "out", "out has NaN"),
    "plain_assert": lambda: AssertionError("out: something else"),
    "run_error": lambda: RuntimeError("out: the op failed"),
    "none": lambda: None,
}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("case", [pytest.param(ONE, id="one"), pytest.param(SQUARE, id="square")])
@pytest.mark.parametrize("what", list(RAISE))
def test_value(adapter, case, what):
    error = RAISE[what]()
    if error is not None:
        raise error


@pytest.mark.parametrize("adapter,name", [(Declaring(), "cpu"), (Declaring(), "cuda")],
                         ids=["cpu-declaring", "cuda-declaring"])
def test_by_id(adapter, name):
    raise ratio("dk")


@pytest.mark.parametrize("adapter", [Declaring()], ids=["declaring"])
def test_other_name(adapter):
    raise ratio("out")
'''

DECLARING = '''
import json
import os

import pytest

pytest_plugins = ["te_conformance.suites.plugin"]
''' + RECORDING

# test_value[what-case-adapter]: the declared difference (out, dq where sq == 1) applies to the
# "one" case of the declaring adapter only
DECLARED_ONE = {
    "ratio_out": "XFAIL",
    "zero_rows_dq": "XFAIL",
    "both": "XFAIL",
    "undeclared": "FAILED",
    "declared_and_undeclared": "FAILED",
    "other_check": "FAILED",
    "plain_assert": "FAILED",
    "run_error": "FAILED",
    "none": "FAILED",  # XPASS(strict): the difference no longer shows
}


def _expected() -> dict[str, str]:
    out = {}
    for what, declared in DECLARED_ONE.items():
        for case in ("one", "square"):
            for adapter in ("declaring", "plain"):
                plain = "PASSED" if what == "none" else "FAILED"
                applies = case == "one" and adapter == "declaring"
                out[f"test_value[{what}-{case}-{adapter}]"] = declared if applies else plain
    out["test_by_id[cpu-declaring]"] = "XFAIL"
    out["test_by_id[cuda-declaring]"] = "FAILED"  # its id does not match the pattern
    out["test_other_name[declaring]"] = "FAILED"  # no difference names this test
    return out


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    """(outcome by test name, the output, the recorded user properties by test name)."""
    tmp_path = tmp_path_factory.mktemp("declared")
    got, log = _run(tmp_path, DECLARED_CASES, DECLARING)
    return got, log, json.loads((tmp_path / "recorded.json").read_text())


def test_declared_difference_occurs_xfails_else_fails(declared):
    """A declared difference that shows is xfailed; one that does not show fails (XPASS
    strict); a failure of an undeclared tensor or check, or a run error, fails."""
    got, log, _ = declared
    assert got == _expected(), log[-5000:]
    assert "declared difference of declaring (out,dq): rows differ" in log, log[-3000:]
    assert "[XPASS(strict)]" in log, log[-3000:]


def test_applied_differences_are_recorded_for_the_report(declared):
    _, log, recorded = declared
    entries = recorded["test_value[ratio_out-one-declaring]"]
    (entry,) = [e for e in entries if e.get("kind") == "expected"]
    assert entry["source"] == "declared" and entry["adapter"] == "declaring"
    assert entry["tensors"] == ["out", "dq"] and entry["reason"] == "rows differ"
    path, _, line = entry["defined_at"].partition(":")
    assert path == "test_cases.py" and DECLARED_CASES.splitlines()[int(line) - 1].strip(
    ).startswith('Difference(test="test_value*"'), entry
    (by_id,) = [e for e in recorded["test_by_id[cpu-declaring]"] if e.get("kind") == "expected"]
    assert by_id["tensors"] == ["dk"] and by_id["reason"] == "by id"
    for name in ("test_value[ratio_out-square-declaring]", "test_value[ratio_out-one-plain]",
                 "test_by_id[cuda-declaring]"):  # fmt: skip
        assert not [e for e in recorded[name] if e.get("kind") == "expected"], name


def test_difference_fields_and_matching():
    d = Difference(test="test_align*", tensors="out, dq", reason="why", where=lambda c: c.sq == 1)
    here = f"test_expected.py:{sys._getframe().f_lineno - 1}"
    assert d.tensors == ("out", "dq") and d.defined_at == here
    one = AttnCase("bshd_bshd_bshd", "fp32", "causal", device="cpu", sq=1, skv=9)
    assert d.matches("test_alignment", "x", one)
    assert not d.matches("test_core", "x", one)
    assert not d.matches("test_alignment", "x", AttnCase("bshd_bshd_bshd", "fp32", "causal"))
    assert not d.matches("test_alignment", "x", None)  # a predicate needs an AttnCase
    by_id = Difference(test="test_fuzz_*", tensors=("dk",), reason="why", ids="sbhd-*")
    assert by_id.matches("test_fuzz_module", "sbhd-cpu-x", None)
    assert not by_id.matches("test_fuzz_module", "thd-cpu-x", None)
    for bad in (dict(tensors=()), dict(tensors=""), dict(reason=""), dict(test="")):
        with pytest.raises(ValueError):
            Difference(**{"test": "t", "tensors": ("out",), "reason": "r", **bad})
    assert Adapter.differences == ()


def test_fully_masked_rows_counts_real_queries_without_a_key():
    """suites.cases.fully_masked_rows, the predicate helper, against counts worked out by hand."""
    from te_conformance.suites.cases import fully_masked_rows

    base = dict(device="cpu", b=2, h=4, hg=4, d=8, dv=8)
    # bottom-right with sq = 22 > skv = 13: the first 9 rows of each element keep no key
    assert fully_masked_rows(AttnCase("bshd_bshd_bshd", "fp32", "causal_bottom_right",
                                      sq=22, skv=13, **base)) == 2 * 9  # fmt: skip
    # top-left keeps key 0 for every row; no mask keeps all
    for mask in ("causal", "no_mask"):
        assert fully_masked_rows(AttnCase("bshd_bshd_bshd", "fp32", mask, sq=22, skv=13,
                                          **base)) == 0  # fmt: skip
    # arbitrary: the suites mask row 1 of every (element, head) whole (cases.py _call_kwargs)
    assert fully_masked_rows(AttnCase("bshd_bshd_bshd", "fp32", "arbitrary", sq=13, skv=13,
                                      **base)) >= 2 * 4  # fmt: skip


# ------------------------------------------------------------------ TE deviations: strict, narrow


def _judged_case(return_max_logit=False):
    import torch

    from te_conformance.suites.adapters import ADAPTERS
    from te_conformance.suites.cases import make_inputs
    from te_conformance.suites.checks.attention import run_impl

    case = AttnCase("bshd_bshd_bshd", "fp32", "causal", device="cpu", b=1, sq=4, skv=4, h=2,
                    hg=2, d=4, dv=4, return_max_logit=return_max_logit)  # fmt: skip
    adapter = ADAPTERS["te_fast"]
    inputs = make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
    impl = run_impl(adapter, adapter.build(case, case.d**-0.5), case, inputs)
    return case, inputs, impl


def _outcome(deviations, case, inputs, impl):
    """What the expectations of ``deviations`` make of the judgement of ``impl``."""
    from te_conformance.suites.checks.attention import judge_against_reference

    try:
        judge_against_reference(case, inputs, impl)
        error = None
    except AssertionError as e:
        error = e
    return settle([d.expectation() for d in deviations], error)


def test_te_deviations_are_strict_and_narrow():
    """A case a recorded TE deviation explains xfails only when it fails the value comparisons
    (ratio, exact zeros); M1 only by max_logit's dtype; a NaN, another check, or no failure at
    all fails the test."""
    import torch

    from te_conformance.suites.te_deviations import D1, M1

    case, inputs, impl = _judged_case()
    out, max_logit, grads = impl
    assert _outcome((), case, inputs, impl).outcome is None
    fixed = _outcome((D1,), case, inputs, impl)
    assert fixed.outcome == "failed" and "did not occur" in fixed.why
    shifted = (out + 0.1, max_logit, grads)  # values differ, as a mask deviation makes them
    assert _outcome((D1,), case, inputs, shifted).outcome == "xfailed"
    other = _outcome((M1,), case, inputs, shifted)
    assert other.outcome == "failed" and "out: max |impl - ref64|" in other.why
    nan = out.clone()
    nan[0, 0, 0] = float("nan")
    got = _outcome((D1,), case, inputs, (nan, max_logit, grads))
    assert got.outcome == "failed" and "not explained by the expected differences" in got.why
    assert "out has NaN" in got.why
    case, inputs, impl = _judged_case(return_max_logit=True)
    out, max_logit, grads = impl
    low = (out, max_logit.to(torch.bfloat16), grads)  # TE's max_logit in O's dtype
    assert _outcome((M1,), case, inputs, low).outcome == "xfailed"
    got = _outcome((D1,), case, inputs, low)
    assert got.outcome == "failed" and "max_logit dtype" in got.why


def test_what_an_expectation_explains():
    from te_conformance.suites.expected import from_deviation
    from te_conformance.suites.te_deviations import D1, M1

    ratio, zero = CheckError.new("ratio", "dk", "dk"), CheckError.new("zero_rows", "out", "out")
    nan, dtype = CheckError.new("nan", "dv", "dv"), CheckError.new("dtype", "max_logit", "ml")
    table = CheckError.new("table", "out", "grids")
    d1, m1 = D1.expectation(), M1.expectation()
    assert all(d1.explains(f) for f in (ratio, zero, table)) and not d1.explains(nan)
    assert m1.explains(dtype) and not d1.explains(dtype) and not m1.explains(ratio)
    assert not d1.explains(AssertionError("dk: something"))
    ranged = Expectation("known_failure", "k", "why", checks=("ratio",), tensors=("dk",),
                         max_ratio=2.0)  # fmt: skip
    at = lambda r: CheckError.new("ratio", "dk", "dk", ratio=r)  # noqa: E731
    assert ranged.explains(at(1.5)) and ranged.explains(at(2.0))
    assert not ranged.explains(at(2.5)) and not ranged.explains(at(float("nan")))
    assert not ranged.explains(ratio)  # a ratio failure that does not tell its ratio
    plain = from_deviation(type("D", (), {"id": "x", "reason": "a reason"})(), "an_adapter")
    assert plain.source == "declared" and plain.adapter == "an_adapter"
    assert plain.explains(ratio) and plain.explains(table) and not plain.explains(nan)
    assert d1.source == "te_deviation" and d1.id == "D1" and d1.title == D1.title
    assert d1.reproducer == "python -m te_conformance.suites.te_deviations D1"
