"""What a conformance test records and the report reads, end to end in a subprocess: a test of
a feature the catalogue does not have (its Feature in its own marker) becomes a row of the
matrix with no edit anywhere else; a command a test notes for its failure is the case's
reproducer; a marker naming no feature, or redefining one, is a usage error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from te_conformance.reports import matrix as mx
from te_conformance.reports.model import load_report

ROOT = Path(__file__).resolve().parents[1]

NEW_FEATURE_TEST = '''
import pytest

from te_conformance.suites import expected
from te_conformance.suites.features import Feature

PAGED = Feature("paged_kv", "Layouts", "paged KV cache", "the paged-KV test")


@pytest.mark.feature(PAGED)
@pytest.mark.per_adapter(device=["cpu"])
def test_paged(adapter, device):
    pass


@pytest.mark.feature("dropout", PAGED)
@pytest.mark.per_adapter(device=["cpu"])
def test_noted(adapter, device):
    expected.note_reproducer("python -c 'shows_it()'")
    assert False, "shown"
'''


def _run(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_throwaway.py").write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "te_conformance.suites.plugin", "--rootdir", str(tmp_path), "-c",
           str(tmp_path / "pytest.ini"), "--te-report", str(tmp_path / "report.json"),
           "--impl", "torch.sdpa", "-q", str(tmp_path / "test_throwaway.py")]  # fmt: skip
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.slow
def test_a_new_feature_and_a_noted_reproducer_reach_the_matrix(tmp_path):
    proc = _run(tmp_path, NEW_FEATURE_TEST)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "1 failed, 1 passed" in out, out[-3000:]
    report = load_report(tmp_path / "report.json")
    cases = {c["nodeid"].split("::")[1]: c for c in report["cases"]}
    assert cases["test_paged[cpu-torch.sdpa]"]["features"] == ["paged_kv"]
    noted = cases["test_noted[cpu-torch.sdpa]"]
    assert noted["features"] == ["dropout", "paged_kv"]
    assert noted["reproducer"] == "python -c 'shows_it()'"
    assert cases["test_paged[cpu-torch.sdpa]"]["reproducer"] is None  # passed: nothing noted
    rows = {f["key"]: f for f in report["environment"]["features"]}
    assert rows["paged_kv"] == {"key": "paged_kv", "group": "Layouts",
                                "label": "paged KV cache", "rule": "the paged-KV test"}  # fmt: skip
    assert list(rows).index("paged_kv") == len(rows) - 1  # after the catalogue's rows
    m = mx.build_matrix([("report.json", report)])
    cell = next(r for r in m["rows"] if r["key"] == "paged_kv")["cells"]["torch.sdpa"]
    assert (cell["state"], cell["passed"], cell["failed"]) == ("fail", 1, 1)
    assert cell["reproducer"] == "python -c 'shows_it()'"
    json.dumps(m)


@pytest.mark.slow
@pytest.mark.parametrize(
    "marker, message",
    [
        ('"paged_kv"', "unknown feature 'paged_kv'"),
        ('Feature("dropout", "Modes", "drop", "x")', "feature 'dropout' is defined differently"),
    ],
)
def test_a_feature_marker_that_names_nothing_is_a_usage_error(tmp_path, marker, message):
    text = (
        "import pytest\nfrom te_conformance.suites.features import Feature\n\n\n"
        f"@pytest.mark.feature({marker})\n@pytest.mark.per_adapter(device=['cpu'])\n"
        "def test_x(adapter, device):\n    pass\n"
    )
    proc = _run(tmp_path, text)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4 and message in out, out[-3000:]
