"""The compute-sanitizer step without a GPU: the driver's dry run on the CPU (every case it would
run under the sanitizer, with the CPU's error-or-poison expectations), tools/sanitize/run.sh's logic
against a stand-in compute-sanitizer (tests/sanitize_fixtures), and the log summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.sanitize import summary as sanitize_summary

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "tests" / "sanitize_fixtures" / "compute-sanitizer"
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "STUB_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("TE_FAST_DEBUG_CHECKS", None)
    env.update(extra)
    return env


@pytest.mark.parametrize("reduced", [False, True], ids=["full", "reduced"])
def test_driver_dry_run_on_cpu(reduced):
    """Every op and module case of the sanitizer run, on the CPU: valid calls succeed, bad
    cu_seqlens raise (the CUDA run expects NaN poisoning instead)."""
    import te_fast

    if te_fast.device_unavailable_reason("cpu"):
        pytest.skip(te_fast.device_unavailable_reason("cpu"))
    cmd = [sys.executable, "tools/sanitize/ops.py", "--device", "cpu", "--module"]
    result = subprocess.run(
        cmd + (["--reduced"] if reduced else []), cwd=ROOT, env=_env(), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("sanitize_ops: done: ") and "module calls" in last, last
    calls = int(last.split("done: ")[1].split()[0])
    assert calls > (300 if reduced else 1500), last


def test_driver_case_lists_cover_the_issue():
    """The softmax widths, the conversion cases and the module's axes the issue names."""
    from tools.sanitize import module as sanitize_module
    from tools.sanitize import ops as sanitize_ops

    for sk in (1, 32, 100, 1024, 4096, 20000, 131080, 140000):
        assert sk in sanitize_ops.COLS
    assert {1, 1024, 20000, 140000} <= set(sanitize_ops.REDUCED_COLS)
    bad = {"non_monotone", "negative", "past_the_buffer", "all_empty", "no_sequence",
           "num_tokens_too_small", "longer_than_max_seqlen"}  # fmt: skip
    assert bad <= set(sanitize_ops.CONVERT_CASES)
    cases = sanitize_module.cases(reduced=False)
    seen = lambda attr: {getattr(c, attr) for c, _, _ in cases}  # noqa: E731
    from te_ref.layouts import ATTN_MASK_TYPES, LAYOUTS

    assert seen("layout") >= set(LAYOUTS)
    assert seen("mask_type") == set(ATTN_MASK_TYPES)
    assert {"vanilla", "off-by-one", "learnable"} == seen("softmax_type")
    assert {"no_bias", "pre_scale_bias", "post_scale_bias", "alibi"} == seen("bias_type")
    assert any(c.h != c.hg for c, _, _ in cases)  # GQA/MQA
    assert any(p > 0 for _, p, _ in cases) and {"delayed", "current", "output"} <= {
        r for _, _, r in cases
    }
    for family in ("sbhd", "bshd", "thd"):  # every mask type a family takes (thd: padding ones)
        masks = {c.mask_type for c, _, _ in cases if c.layout.startswith(family[:2])}
        if family == "thd":
            assert masks == {"padding", "padding_causal", "padding_causal_bottom_right"}, masks
        else:
            assert len(masks) >= 5, (family, masks)


def _sanitize(tmp_path, **env) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / "san"
    calls = tmp_path / "calls.txt"
    settings = {"SANITIZER": str(STUB), "SANITIZE_DEVICE": "cpu", "PYTHON": sys.executable,
                "SANITIZE_DRIVER_ARGS": "--reduced", "STUB_CALLS": str(calls), **env}  # fmt: skip
    result = subprocess.run(
        ["bash", "tools/sanitize/run.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
        timeout=600, env=_env(**settings),
    )  # fmt: skip
    return result, calls.read_text() if calls.exists() else ""


def test_sanitize_script_clean_run(tmp_path):
    """Four tools side by side, one summary line each, exit 0; racecheck on te_fast's kernels
    and the reduced list."""
    result, calls = _sanitize(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    for tool in TOOLS:
        assert any(line.startswith(f"{tool}: 0 errors") and "module calls" in line
                   for line in lines), result.stdout  # fmt: skip
    assert lines[-1] == "sanitize: PASS (0 findings)"
    race = [c for c in calls.splitlines() if c.startswith("racecheck")][0]
    assert "--kernel-name kns=te_fast_kernels" in race and "--reduced" in race
    mem = [c for c in calls.splitlines() if c.startswith("memcheck")][0]
    assert "--kernel-name" not in mem and "--module" in mem
    assert (tmp_path / "san" / "summary.txt").read_text().strip().endswith("PASS (0 findings)")


def test_sanitize_script_fails_on_a_finding(tmp_path):
    result, _ = _sanitize(tmp_path, SANITIZE_TOOLS="memcheck initcheck",
                          STUB_FINDINGS="initcheck:3")  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert "initcheck: 3 errors; in te_fast kernels: 3" in result.stdout, result.stdout
    assert "memcheck: 0 errors" in result.stdout and "sanitize: FAIL" in result.stdout


def test_sanitize_script_fails_on_a_timeout(tmp_path):
    result, _ = _sanitize(tmp_path, SANITIZE_TOOLS="synccheck", SANITIZE_TIMEOUT="2",
                          STUB_SLEEP="synccheck:60")  # fmt: skip
    assert result.returncode == 1 and "synccheck: TIMEOUT after 2" in result.stdout, result.stdout


def test_sanitize_script_fails_when_the_driver_fails(tmp_path):
    result, _ = _sanitize(tmp_path, SANITIZE_TOOLS="memcheck", SANITIZE_DRIVER_ARGS="--bogus")
    assert result.returncode == 1 and "driver did not finish" in result.stdout, result.stdout


def test_sanitize_script_without_the_sanitizer(tmp_path):
    result, _ = _sanitize(tmp_path, SANITIZER="/nonexistent/compute-sanitizer")
    assert result.returncode == 1 and "not found" in result.stdout


# ----------------------------------------------------------------------------- the summary

DONE = "sanitize_ops: done: 1566 op calls, 78 module calls (forward and backward) on cuda in 80 s"


def test_summary_clean_and_racecheck_lines():
    ok, line = sanitize_summary.summarize(
        "memcheck", "========= ERROR SUMMARY: 0 errors\n", DONE, 0
    )
    assert ok and line.startswith("memcheck: 0 errors; 1566 op calls"), line
    log = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    ok, line = sanitize_summary.summarize("racecheck", log, DONE, 0)
    assert ok and line.startswith("racecheck: 0 errors (0 errors, 0 warnings)"), line


def test_summary_counts_racecheck_warnings_as_findings():
    log = "========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)\n"
    ok, line = sanitize_summary.summarize("racecheck", log, DONE, 0)
    assert not ok and line.startswith("racecheck: 2 errors"), line


def test_summary_attributes_findings_to_kernels():
    log = (
        "========= Uninitialized __global__ memory read of size 4 bytes\n"
        "=========     at void at::native::vectorized_elementwise_kernel<4, float>(int)+0x10\n"
        "========= Invalid __global__ write of size 2 bytes\n"
        "=========     at void te_fast_kernels::(anonymous namespace)::thd_to_bshd_kernel<unsigned"
        " short>(te_fast_kernels::ConvertArgs)+0x20\n"
        "========= ERROR SUMMARY: 2 errors\n"
    )
    ok, line = sanitize_summary.summarize("initcheck", log, DONE, 1)
    assert not ok and "2 errors; in te_fast kernels: 1, others: at::native::vectorized" in line


def test_summary_without_a_summary_line_fails():
    ok, line = sanitize_summary.summarize("memcheck", "", "Traceback ...\nRuntimeError: boom", 1)
    assert not ok and line.startswith("memcheck: no sanitizer summary (exit 1)") and "boom" in line
    out = (
        "sanitize_ops: softmax torch.float32: 0 op calls, 3 s\n"
        "sanitize_ops: conversions: 1398 op calls, 250 s\n"
    )
    ok, line = sanitize_summary.summarize("memcheck", "", out, 124, 360)
    assert not ok and line.startswith("memcheck: TIMEOUT after 360"), line
    assert "last: conversions: 1398 op calls, 250 s" in line, line
    ok, line = sanitize_summary.summarize("memcheck", "ERROR SUMMARY: 0 errors", "", 0)
    assert not ok and "driver did not finish" in line, line
