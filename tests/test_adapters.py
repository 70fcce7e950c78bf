"""Adapter capabilities: the declarations, and the capability tests run through every selected
adapter (te_fast keeping its ids), catching adapters that break or overstate a capability."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from te_conformance.reports.model import load_report
from te_conformance.suites.adapters import ADAPTERS, CAPABILITIES
from te_conformance.suites.adapters.base import Adapter, Support

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "adapter_fixtures"
PROBLEMS = (
    "unknown_layout", "unknown_mask", "heads", "cu_dtype", "cu_shape", "thd_max_seqlen",
    "bias_missing", "window_conflict", "padding_no_lengths", "bias_shape",
    "learnable_without_offset",
)  # fmt: skip


def test_te_fast_declares_every_capability():
    te_fast = ADAPTERS["te_fast"]
    assert {c: te_fast.declines(needs=(c,), device="cuda") for c in CAPABILITIES} == {
        c: [] for c in CAPABILITIES
    }


def test_sdpa_lacks_dropout_and_validation_with_reasons():
    sdpa = ADAPTERS["torch.sdpa"]

    def lacks(capability):
        found = sdpa.declines(needs=(capability,), device="cpu")
        return found[0].text if found else None

    assert lacks("capturable") is None and lacks("sync_free") is None
    assert "does not pass dropout_p" in lacks("dropout")
    assert lacks("dropout_ctx").startswith("torch.sdpa lacks dropout_ctx")
    assert lacks("validates_arguments").startswith("torch.sdpa lacks validates_arguments")
    (reason,) = sdpa.declines(needs=("dropout",), device="cpu")
    assert reason.feature == "dropout"


def test_capability_on_a_device():
    """capability_devices narrows a capability to device types; elsewhere it is lacking, with
    the declaration's reason."""
    sdpa = ADAPTERS["torch.sdpa"]
    assert sdpa.support.has("deterministic") and sdpa.support.has("deterministic", "cpu")
    (reason,) = sdpa.declines(needs=("deterministic",), device="cuda")
    assert reason.text.startswith("torch.sdpa lacks deterministic on cuda")
    assert "cuDNN" in reason.text
    assert ADAPTERS["te_fast"].support.has("deterministic", "cuda")
    assert [r.text for r in sdpa.declines(needs=("dropout",), device="cpu")] == [
        r.text for r in sdpa.declines(needs=("dropout",), device="cuda")
    ]


def test_unknown_capability_is_an_error():
    with pytest.raises(ValueError, match="unknown capability 'dropuot'"):
        ADAPTERS["te_fast"].declines(needs=("dropuot",))
    with pytest.raises(ValueError, match="unknown"):
        Support(capabilities=("dropuot",))


def test_an_adapter_declaring_the_old_way_is_refused_with_the_way_to_declare():
    """Support is declared once (Support); the class attributes it replaces are refused at
    --impl with a message naming them, never silently ignored."""
    from te_conformance.suites.adapters import _instance

    class Old(Adapter):
        name = "old"
        dtypes = ("fp32",)
        supports_window = False

    with pytest.raises(pytest.UsageError, match=r"old way \(dtypes, supports_window\).*Support"):
        _instance(Old, "old")
    assert _instance(ADAPTERS["te_fast"], "te_fast") is ADAPTERS["te_fast"]


def test_no_adapter_of_the_project_declares_the_old_way():
    """Every Adapter class the project ships (the registry, te_ref's, the selftest stand-ins,
    the examples) declares its support in ``support`` alone: an old class attribute would be
    ignored wherever the adapter is not selected through --impl."""
    import importlib
    import sys

    ROOT = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(ROOT / "examples" / n / "src") for n in ("my_attention", "hf_sdpa")]
    try:
        for module in ("te_conformance.suites.adapters.te_ref", "my_attention.adapter",
                       "tests.adapter_fixtures.selftest_adapters",
                       "te_conformance.suites.checks.broken_ops"):  # fmt: skip
            importlib.import_module(module)
        importlib.import_module("hf_sdpa.adapter")  # imports transformers only when called
    finally:
        del sys.path[:2]

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = {f"{c.__module__}.{c.__qualname__}": c.old_declarations() for c in subclasses(Adapter)
             if "<locals>" not in c.__qualname__}  # not a test's own throwaway class
    assert len(found) >= 8, sorted(found)
    assert not {n: old for n, old in found.items() if old}


def test_impl_help_names_the_registered_adapters():
    from te_conformance.suites import plugin

    options = {}

    class Parser:
        def addoption(self, name, **kwargs):
            options[name] = kwargs

    plugin.pytest_addoption(Parser())
    text = options["--impl"]["help"]
    assert all(name in text for name in ADAPTERS) and "default: te_fast" in text, text


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[str, str | None]]:
    """nodeid -> (outcome, skip reason) of the capability tests over te_fast, torch.sdpa and the
    selftest adapters on the CPU, in a child pytest."""
    out = tmp_path_factory.mktemp("adapters") / "report.json"
    impls = ["te_fast", "torch.sdpa", "selftest.ignores_dropout", "selftest.fixed_dropout",
             "selftest.claims_validation", "selftest.uncapturable", "selftest.fp8_ignored",
             "selftest.fp8_most_recent"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), str(FIXTURES), env.get("PYTHONPATH")])
    )
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
        "-p", "selftest_adapters", "-q", "--te-report", str(out),
        *[a for name in impls for a in ("--impl", name)],
        "-k", "(test_dropout or test_invalid_arguments) and cpu "
        "or test_compiled and cudagraph and selftest.uncapturable "
        "or test_module_rule and cpu and (claims_validation or sdpa) "
        "or test_module_dropout_same_seed and cpu "
        "or test_fp8 and not te_ref and cpu and (sbh3d or three_steps or hybrid)",
        "suites/conformance/test_attention.py", "suites/conformance/test_compile.py",
        "suites/conformance/test_bad_input.py", "suites/conformance/test_determinism.py",
        "suites/conformance/test_fp8.py",
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    return {c["nodeid"]: (c["outcome"], c["skip_reason"]) for c in load_report(out)["cases"]}


def _attn(name: str) -> str:
    return f"suites/conformance/test_attention.py::{name}"


def _dropout_ids(suffix: str) -> dict[str, str]:
    return {
        "statistics[0.1]": _attn(f"test_dropout_statistics[0.1-cpu{suffix}]"),
        "statistics[0.3]": _attn(f"test_dropout_statistics[0.3-cpu{suffix}]"),
        "reproducible": _attn(f"test_dropout_reproducible_and_backward_consistent[cpu{suffix}]"),
        "zero": _attn(f"test_dropout_zero_is_identity[cpu{suffix}]"),
    }


def test_te_fast_keeps_its_ids_and_passes(outcomes):
    ids = [
        *_dropout_ids("").values(),
        *(_attn(f"test_invalid_arguments[{p}-cpu]") for p in PROBLEMS),
    ]
    assert {i: outcomes.get(i, ("missing",))[0] for i in ids} == dict.fromkeys(ids, "passed")


def test_sdpa_skips_with_its_reasons(outcomes):
    for nodeid in _dropout_ids("-torch.sdpa").values():
        outcome, reason = outcomes[nodeid]
        assert outcome == "skipped" and reason.startswith("torch.sdpa lacks dropout"), nodeid
    for problem in PROBLEMS:
        outcome, reason = outcomes[_attn(f"test_invalid_arguments[{problem}-cpu-torch.sdpa]")]
        assert outcome == "skipped" and "lacks validates_arguments" in reason, problem


def test_dropout_tests_catch_broken_dropout(outcomes):
    ignores = {k: outcomes[i][0] for k, i in _dropout_ids("-selftest.ignores_dropout").items()}
    assert ignores == {"statistics[0.1]": "failed", "statistics[0.3]": "failed",
                       "reproducible": "failed", "zero": "passed"}  # fmt: skip
    fixed = {k: outcomes[i][0] for k, i in _dropout_ids("-selftest.fixed_dropout").items()}
    assert fixed == {"statistics[0.1]": "failed", "statistics[0.3]": "passed",
                     "reproducible": "passed", "zero": "failed"}  # fmt: skip


def test_invalid_argument_test_catches_an_adapter_that_does_not_validate(outcomes):
    got = {
        p: outcomes[_attn(f"test_invalid_arguments[{p}-cpu-selftest.claims_validation]")][0]
        for p in PROBLEMS
    }
    assert got == dict.fromkeys(PROBLEMS, "failed")


def test_cuda_graph_variants_skip_an_uncapturable_adapter(outcomes):
    compiled = {i: o for i, o in outcomes.items()
                if i.startswith("suites/conformance/test_compile.py")}  # fmt: skip
    assert len(compiled) >= 26  # the CUDA-graph variants of the compile matrix
    for nodeid, (outcome, reason) in compiled.items():
        assert nodeid.endswith(("selftest.uncapturable.cudagraph]", "cudagraphs_backend]"))
        assert outcome == "skipped" and reason == (
            "selftest.uncapturable lacks capturable (CUDA-graph capture: torch.compile "
            "mode='reduce-overhead', cudagraphs backend): declared so by the selftest"
        ), nodeid


def _bad_input(problem: str, suffix: str) -> str:
    return f"suites/conformance/test_bad_input.py::test_module_rule[{problem}-cpu{suffix}]"


def test_bad_input_runs_through_adapters_that_validate(outcomes):
    """test_bad_input's module rules: torch.sdpa skips with its reason; an adapter claiming
    validates_arguments without checking fails every rule it is given (TypeErrors and silent
    outputs are no ValueError naming the problem); te_fast's own rules are not asked of it."""
    from te_conformance.suites.bad_calls import STANDARD_PROBLEMS, TE_FAST_PROBLEMS

    claims = {p: outcomes[_bad_input(p, "-selftest.claims_validation")] for p in STANDARD_PROBLEMS}
    assert {o for o, _ in claims.values()} == {"failed"}, claims
    assert len(claims) >= 50
    assert not [p for p in TE_FAST_PROBLEMS if _bad_input(p, "") in outcomes]
    for problem in STANDARD_PROBLEMS:
        outcome, reason = outcomes[_bad_input(problem, "-torch.sdpa")]
        assert outcome == "skipped" and "lacks validates_arguments" in reason, problem


def test_determinism_runs_through_adapters(outcomes):
    """test_module_dropout_same_seed per adapter: te_fast keeps its id and passes, torch.sdpa
    skips (no dropout), an adapter that ignores dropout fails (another seed, the same output)."""
    got = {
        name: outcomes[
            f"suites/conformance/test_determinism.py::test_module_dropout_same_seed[cpu{suffix}]"
        ]
        for name, suffix in (("te_fast", ""), ("sdpa", "-torch.sdpa"),
                             ("ignores", "-selftest.ignores_dropout"),
                             ("fixed", "-selftest.fixed_dropout"))
    }  # fmt: skip
    assert got["te_fast"][0] == "passed" and got["fixed"][0] == "passed"
    assert got["sdpa"][0] == "skipped" and got["sdpa"][1].startswith("torch.sdpa lacks dropout")
    assert got["ignores"][0] == "failed"


def _fp8(outcomes, test: str, suffix: str) -> dict[str, tuple[str, str | None]]:
    """The CPU cases of test_fp8.py's ``test`` run for the adapter whose id suffix is ``suffix``
    ("" for te_fast): the id's leading part -> (outcome, skip reason)."""
    head, tail = f"suites/conformance/test_fp8.py::{test}[", f"cpu{suffix}]"
    return {
        nodeid[len(head) : -len(tail)]: got
        for nodeid, got in outcomes.items()
        if nodeid.startswith(head) and nodeid.endswith(tail)
    }


def test_fp8_runs_through_adapters(outcomes):
    """test_fp8.py per adapter (the CPU sbh3d, three-pass and HYBRID cases): te_fast keeps its
    ids and passes; torch.sdpa skips, naming FP8; an adapter declaring FP8 that computes without
    it fails every emulation case and skips the state cases (it lacks fp8_state); one whose
    recipe translation drops amax_compute_algo fails the "max" three-pass case alone."""
    emulation = [f"sbh3d-{d}-{r}-" for d in ("bf16", "fp16") for r in ("delayed", "current")]
    three = [f"{r}-" for r in ("max", "most_recent", "current")]
    te_fast = {
        **_fp8(outcomes, "test_fp8_matches_reference_emulation", ""),
        **_fp8(outcomes, "test_delayed_scaling_three_steps", ""),
        **_fp8(outcomes, "test_hybrid_uses_e5m2_in_backward", ""),
    }
    assert set(te_fast) >= {*emulation, *three, ""}, sorted(te_fast)
    assert {o for o, _ in te_fast.values()} == {"passed"}, te_fast
    sdpa = {
        **_fp8(outcomes, "test_fp8_matches_reference_emulation", "-torch.sdpa"),
        **_fp8(outcomes, "test_delayed_scaling_three_steps", "-torch.sdpa"),
    }
    assert set(sdpa) == {*emulation, *three}
    for outcome, reason in sdpa.values():
        assert outcome == "skipped" and reason.startswith("torch.sdpa lacks fp8"), reason
    ignored = "-selftest.fp8_ignored"
    got = _fp8(outcomes, "test_fp8_matches_reference_emulation", ignored)
    assert {k: o for k, (o, _) in got.items()} == dict.fromkeys(emulation, "failed")
    for test in ("test_delayed_scaling_three_steps", "test_hybrid_uses_e5m2_in_backward"):
        for outcome, reason in _fp8(outcomes, test, ignored).values():
            assert outcome == "skipped" and "lacks fp8_state" in reason, test
    recent = _fp8(outcomes, "test_delayed_scaling_three_steps", "-selftest.fp8_most_recent")
    assert {k: o for k, (o, _) in recent.items()} == {
        "max-": "failed", "most_recent-": "passed", "current-": "passed"
    }
