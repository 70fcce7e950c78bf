"""End to end in subprocesses: the plugin on a tiny suite (plain, -n 2, shards), and `run`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from te_conformance.reports import baseline as B
from te_conformance.reports.merge import merge_reports
from te_conformance.reports.model import load_report

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "reports_fixtures" / "tiny_suite.py"
ALL_IDS = {
    "test_tiny.py::test_attn[bf16]",
    "test_tiny.py::test_attn[fp16]",
    "test_tiny.py::test_attn[fp32]",
    "test_tiny.py::test_compiled",
    "test_tiny.py::test_gpu_only",
    "test_tiny.py::test_fp8",
    "test_tiny.py::test_softmax_fails",
    "test_tiny.py::test_setup_error",
}


def make_suite(tmp: Path, **flags) -> Path:
    """Copy the tiny suite into tmp with its own conftest/pytest.ini; flags rewrite its switches."""
    text = TINY.read_text()
    for name, value in flags.items():
        text = text.replace(f"{name} = {not value}", f"{name} = {value}")
    (tmp / "test_tiny.py").write_text(text)
    (tmp / "conftest.py").write_text('pytest_plugins = ["te_conformance.reports.plugin"]\n')
    (tmp / "pytest.ini").write_text("[pytest]\n")
    return tmp


def child_env(**extra) -> dict:
    """The environment for a child pytest: the project importable, nothing of this run leaking."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDA_VISIBLE_DEVICES"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def run_pytest(tmp: Path, *args: str, **env) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp),
        "-c",
        str(tmp / "pytest.ini"),
        "-q",
        *args,
        str(tmp),
    ]
    return subprocess.run(
        cmd, cwd=tmp, env=child_env(**env), capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return make_suite(tmp_path_factory.mktemp("tiny"))


def by_id(report: dict) -> dict[str, dict]:
    return {c["nodeid"]: c for c in report["cases"]}


def check_full_report(report: dict) -> None:
    cases = by_id(report)
    assert set(cases) == ALL_IDS
    outcomes = {nodeid.split("::")[1]: c["outcome"] for nodeid, c in cases.items()}
    assert outcomes == {
        "test_attn[bf16]": "passed",
        "test_attn[fp16]": "passed",
        "test_attn[fp32]": "passed",
        "test_compiled": "passed",
        "test_gpu_only": "skipped",
        "test_fp8": "xfailed",
        "test_softmax_fails": "failed",
        "test_setup_error": "error",
    }
    assert report["summary"] | {"duration_s": None} == {
        "passed": 4,
        "failed": 1,
        "skipped": 1,
        "error": 1,
        "xfailed": 1,
        "xpassed": 0,
        "total": 8,
        "duration_s": None,
    }
    attn = cases["test_tiny.py::test_attn[bf16]"]
    assert attn["id"] == "bf16"
    assert attn["fields"]["layout"] == "bshd_bshd_bshd" and attn["fields"]["dtype"] == "bf16"
    assert attn["fields"]["shapes"] == {"b": 2, "s": 128, "h": 4, "d": 64}
    assert [t["name"] for t in attn["tensors"]] == ["out", "dq"]
    assert attn["tensors"][0] == {
        "name": "out",
        "max_abs_err": 0.0005,
        "bound": 0.001,
        "ratio": 0.5,
        "worst_index": [0, 1, 2, 3],
    }
    assert attn["counters"] == {"graph_breaks": 0, "recompiles": 2, "replays": 4}
    fails = cases["test_tiny.py::test_softmax_fails"]
    assert fails["tensors"][0]["ratio"] == "nan" and fails["tensors"][0]["n_failed"] == 7
    assert "softmax mismatch: out has 7 nan elements" in fails["message"]
    assert "raise AssertionError" in fails["longrepr"]
    assert cases["test_tiny.py::test_setup_error"]["message"] == "RuntimeError: fixture exploded"
    assert cases["test_tiny.py::test_gpu_only"]["skip_reason"] == "needs a CUDA device"
    assert cases["test_tiny.py::test_fp8"]["skip_reason"] == "known fp8 gap"
    assert cases["test_tiny.py::test_compiled"]["id"] == "test_compiled"
    assert report["environment"]["machine_class"] and "torch" in report["environment"]
    assert list(cases) == sorted(cases)


def test_plain_run(suite, tmp_path):
    out = tmp_path / "r.json"
    proc = run_pytest(suite, "--te-report", str(out), CUDA_VISIBLE_DEVICES="3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = load_report(out)
    check_full_report(report)
    assert {c["cuda_visible_devices"] for c in report["cases"]} == {"3"}
    assert {c["worker"] for c in report["cases"]} == {None}


def test_xdist_run_loses_nothing(suite, tmp_path):
    out = tmp_path / "r.json"
    proc = run_pytest(suite, "-n", "2", "--te-report", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = load_report(out)
    check_full_report(report)
    assert {c["worker"] for c in report["cases"]} <= {"gw0", "gw1"}
    assert all(c["worker"] for c in report["cases"])
    assert not any(c["cuda_visible_devices"] for c in report["cases"])
    # the failure text must not start with xdist's "[gw0] linux -- Python" banner
    assert not by_id(report)["test_tiny.py::test_softmax_fails"]["longrepr"].startswith("[gw")


def test_crashed_worker_is_reported(tmp_path):
    suite = make_suite(tmp_path, CRASH=True)
    out = tmp_path / "r.json"
    proc = run_pytest(suite, "-n", "2", "--te-report", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cases = by_id(load_report(out))
    crash = cases["test_tiny.py::test_crash"]
    assert crash["outcome"] == "failed"
    assert "crashed while running" in crash["message"]
    assert set(cases) == ALL_IDS | {"test_tiny.py::test_crash"}


def test_shards_cover_every_case_once_and_merge_losslessly(suite, tmp_path):
    full_path = tmp_path / "full.json"
    run_pytest(suite, "--te-report", str(full_path))
    full = load_report(full_path)
    shards = []
    for i in (1, 2, 3):
        path = tmp_path / f"s{i}.json"
        proc = run_pytest(suite, "--te-shard", f"{i}/3", "--te-report", str(path))
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        shards.append((str(path), load_report(path)))
        assert shards[-1][1]["environment"]["shard"] == f"{i}/3"
    ids = [c["nodeid"] for _, r in shards for c in r["cases"]]
    assert sorted(ids) == sorted(ALL_IDS)  # every case exactly once
    assert all(r["cases"] for _, r in shards)  # 8 cases over 3 shards: none is empty

    merged = merge_reports(shards)
    volatile = ("duration_s",)
    strip = lambda r: [{k: v for k, v in c.items() if k not in volatile} for c in r["cases"]]
    assert strip(merged) == strip(full)
    assert {k: v for k, v in merged["summary"].items() if k != "duration_s"} == {
        k: v for k, v in full["summary"].items() if k != "duration_s"
    }
    assert [s["shard"] for s in merged["environment"]["shards"]] == ["1/3", "2/3", "3/3"]
    json.dumps(merged, allow_nan=False)


@pytest.mark.parametrize("shard", ["0/3", "4/3", "x", "1/0"])
def test_bad_shard_is_a_usage_error(suite, shard):
    proc = run_pytest(suite, "--te-shard", shard)
    assert proc.returncode == 4
    assert "--te-shard" in proc.stderr and "1 <= i <= n" in proc.stderr


def test_no_report_without_option(tmp_path):
    suite = make_suite(tmp_path)
    proc = run_pytest(suite)
    assert proc.returncode == 1
    assert not list(suite.glob("*.json"))


# ---------------------------------------------------------------- python -m te_conformance run


def run_cli(suite: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "reports",
        "run",
        "--out",
        str(out),
        *args,
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(suite),
        "-c",
        str(suite / "pytest.ini"),
        str(suite),
    ]
    return subprocess.run(
        cmd, cwd=suite, env=child_env(), capture_output=True, text=True, timeout=180
    )


def test_run_gates_on_the_baseline(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    make_suite(suite, INCLUDE_FAILING=False)
    out, base = tmp_path / "out", tmp_path / "base.json"

    missing = run_cli(suite, out, "--baseline", str(base))
    assert missing.returncode == 0, missing.stdout + missing.stderr  # a first run: NO BASELINE
    assert f"no baseline at {base}" in missing.stdout and "--update-baseline" in missing.stdout
    assert missing.stdout.split("TE conformance verdict")[1].splitlines()[1] == "NO BASELINE"

    first = run_cli(suite, out, "--baseline", str(base), "--update-baseline")
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"baseline updated: {base}" in first.stdout
    assert "-n auto" in first.stdout  # xdist added by default
    assert B.load(base).made_from["summary"]["passed"] == 4

    again = run_cli(suite, out, "--baseline", str(base))
    assert again.returncode == 0, again.stdout + again.stderr
    verdict = again.stdout.split("TE conformance verdict")[1]
    assert verdict.splitlines()[1] == "PASS"
    for name in ("report.json", "report.md", "report.html", "junit.xml"):
        assert (out / name).is_file(), name
        assert str(out / name) in verdict
    assert "no regressions against the baseline" in (out / "report.md").read_text()

    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"schema": "te-conformance-report", "schema_version": 1, "cases": 3}')
    unusable = run_cli(suite, out, "--baseline", str(corrupt))
    assert unusable.returncode == 2, unusable.stdout + unusable.stderr
    assert f"unusable baseline: {corrupt}: 'environment' is missing" in unusable.stdout

    make_suite(suite, INCLUDE_FAILING=False, BREAK_FP16=True)
    broken = run_cli(suite, out, "--baseline", str(base), "-n", "0")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "-n auto" not in broken.stdout  # the user's -n wins
    verdict = broken.stdout.split("TE conformance verdict")[1]
    assert verdict.splitlines()[1] == "FAIL"
    assert "REGRESSED (new failures) test_tiny.py::test_attn[fp16]: passed -> failed" in verdict
    refused = run_cli(suite, out, "--baseline", str(base), "--update-baseline")
    assert refused.returncode == 1 and "refusing to update the baseline" in refused.stdout
    assert B.load(base).made_from["summary"]["failed"] == 0


ALL_SKIPPED_SUITE = """
import pytest


@pytest.mark.parametrize("i", range(3))
def test_needs_a_device(i):
    pytest.skip("no such device here")
"""


def test_a_run_that_skipped_every_case_fails(tmp_path):
    """Issue 46: --no-compare over cases that all skip gave PASS, exit 0 (and without a
    baseline, NO BASELINE): a run that judged nothing is FAIL, whatever the baseline."""
    suite = tmp_path / "suite"
    suite.mkdir()
    make_suite(suite)
    for name in suite.glob("test_*.py"):
        name.unlink()
    (suite / "test_skipped.py").write_text(ALL_SKIPPED_SUITE)
    for args in (("--no-compare",), ("--baseline", str(tmp_path / "none.json"))):
        proc = run_cli(suite, tmp_path / "out", *args, "-n", "0")
        verdict = proc.stdout.split("TE conformance verdict")[1]
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert verdict.splitlines()[1] == "FAIL", verdict
        assert "every one of the 3 case(s) was skipped: nothing was judged" in verdict


SLOW_SUITE = """
import os, time
from pathlib import Path

import pytest


@pytest.mark.parametrize("i", range(4))
def test_quick(i):
    Path(os.environ["TE_TEST_MARKS"], f"quick{i}").touch()


@pytest.mark.parametrize("i", range(4))
def test_slow(i):
    Path(os.environ["TE_TEST_MARKS"], f"slow{i}").touch()
    time.sleep(60)
"""


@pytest.mark.parametrize("target", ["group", "parent"])
def test_stopped_run_leaves_a_partial_report(tmp_path, target):
    """SIGTERM to the process group (a CI time limit, `timeout`) or to `reports run` alone: the
    cases that finished are written, marked partial, and gated FAIL; the slow tests the stop
    caught are left out; no test runs on to its end."""
    suite = tmp_path / "suite"
    marks = tmp_path / "marks"
    suite.mkdir()
    marks.mkdir()
    (suite / "test_slow.py").write_text(SLOW_SUITE)
    (suite / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "te_conformance", "run", "--out", str(out), "--no-compare",
           "-n", "2", "-p", "no:cacheprovider", "--rootdir", str(suite), "-c",
           str(suite / "pytest.ini"), str(suite)]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=suite,
        env=child_env(TE_TEST_MARKS=str(marks)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as under `timeout`
    )
    try:
        # Both workers in a slow test: each has sent the results of its quick tests before.
        deadline = time.monotonic() + 90
        while len(list(marks.glob("slow*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(p.name for p in marks.glob("quick*")) == [f"quick{i}" for i in range(4)]
        time.sleep(1.0)  # for the controller to take them in
        if target == "group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, stdout
    report = load_report(out / "report.json")
    assert report["summary"]["interrupted"] == "SIGTERM"
    assert report["summary"]["collected"] == 8
    outcomes = {c["nodeid"]: c["outcome"] for c in report["cases"]}
    assert outcomes == {f"test_slow.py::test_quick[{i}]": "passed" for i in range(4)}, outcomes
    verdict = stdout.split("TE conformance verdict")[1]
    assert verdict.splitlines()[1] == "FAIL"
    assert "Tests INCOMPLETE (stopped by SIGTERM, 8 collected): 4 passed of 4 cases" in verdict
    assert "stopped early (SIGTERM): the report is partial, 4 case(s) of 8 collected" in verdict
    assert "INCOMPLETE (stopped by SIGTERM" in (out / "report.md").read_text()


@pytest.mark.parametrize("value", ["", "0", "5m", "-3"])
def test_gpu_run_timeout_takes_seconds(tmp_path, value):
    """tools/gpu_run.sh --timeout S bounds its pytest run (a partial report at S): a value that is
    not a positive count of seconds stops it before anything runs."""
    args = ["--timeout", value] if value else ["--timeout"]
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_run.sh"), *args, "--", "-q"],
        env=child_env(OUT=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--timeout takes seconds" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no step ran


def test_gpu_run_bundles_its_outputs_on_exit(tmp_path):
    """The device returns at most 8 files: tools/gpu_run.sh packs every file of $OUT into
    $OUT/all.tar.gz when it exits, a failed step included, and keeps that step's exit code."""
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_run.sh"), "--", "-q"],
        cwd=ROOT,
        env=child_env(OUT=str(tmp_path), PYTHON="false"),  # the build step fails
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with tarfile.open(tmp_path / "all.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"./env.txt", "./build.log", "./build_time.txt"} <= names, names
    assert "./all.tar.gz" not in names
