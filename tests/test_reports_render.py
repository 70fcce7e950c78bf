"""The failures section: one list of entries, the same in report.md and report.html."""

from __future__ import annotations

from pathlib import Path

from te_conformance.reports.model import build_report
from te_conformance.reports.render import (
    TRACEBACKS_N,
    failure_entries,
    render_html,
    render_markdown,
)

ROOT = Path(__file__).resolve().parents[1]


def _case(i: int, outcome: str, message: str | None = "AssertionError: boom") -> dict:
    return {
        "nodeid": f"t.py::test_{i:03d}", "id": f"test_{i:03d}", "outcome": outcome,
        "fields": {}, "tensors": [], "counters": {}, "duration_s": 0.0,
        "message": message, "longrepr": f"frame {i}\nE   assert {i} < 0", "skip_reason": None,
        "worker": None, "cuda_visible_devices": None,
    }  # fmt: skip


def _report() -> dict:
    cases = [_case(0, "passed", None), _case(1, "error", None), _case(2, "failed", "x" * 3000)]
    cases += [_case(i, "failed") for i in range(3, TRACEBACKS_N + 5)]
    cases.append(_case(TRACEBACKS_N + 5, "skipped", None))
    return build_report(cases, {"machine_class": "cpu"}, 1.0)


def test_entries_are_the_failures_in_order_with_tracebacks_for_the_first_ones():
    entries = failure_entries(_report())
    assert [f.nodeid for f in entries] == [
        f"t.py::test_{i:03d}" for i in range(1, TRACEBACKS_N + 5)
    ]
    assert entries[0].outcome == "error" and entries[0].message == "-"
    assert entries[1].message == "x" * 1000
    assert [f.traceback is not None for f in entries] == [True] * TRACEBACKS_N + [False] * 4
    assert entries[0].traceback == "frame 1\nE   assert 1 < 0"


def test_both_renderers_show_the_same_entries():
    report = _report()
    md, page = render_markdown(report), render_html(report)
    n = TRACEBACKS_N + 4
    assert f"## Failures ({n})" in md and f"<h2>Failures ({n})</h2>" in page
    for text in (md, page):
        assert text.count("<summary>traceback</summary>") == TRACEBACKS_N
        assert "test_000" not in text.split("Failures (")[1]  # the passed case
        assert "x" * 1000 in text and "x" * 1001 not in text
    last = f"t.py::test_{TRACEBACKS_N + 4:03d}"
    assert f"### `{last}` (failed)" in md and f"<h3>{last} (failed)</h3>" in page
    assert "E   assert 1 &lt; 0" in page and "E   assert 1 < 0" in md


def test_a_reproducer_runs_from_where_the_run_started(tmp_path):
    """An installed package's suites gated from elsewhere (`python -m te_conformance run --impl X`
    from a temporary directory: rootdir is the package folder holding suites/, not the directory
    the run started in) get a --pyargs reproducer under that package, and it runs from there; a
    rootdir that is no package (the checkout) the absolute file; in the rootdir, the node id as
    it is."""
    import shlex
    import subprocess
    import sys

    from te_conformance.reports.render import reproducer

    nodeid = "suites/conformance/test_attention.py::test_invalid_arguments[unknown_layout-cpu]"
    case = {**_case(0, "failed"), "nodeid": nodeid}
    elsewhere = {"started_in": str(tmp_path), "rootdir": "/site-packages/te_conformance",
                 "rootdir_package": "te_conformance"}  # fmt: skip
    line = reproducer(case, ["--impl", "te_fast"], elsewhere)
    pyargs = ("'te_conformance.suites.conformance.test_attention::"
              "test_invalid_arguments[unknown_layout-cpu]'")  # fmt: skip
    assert line == f"python -m pytest -p no:xdist --impl te_fast --pyargs {pyargs}"
    cmd = [sys.executable, *shlex.split(line)[1:], "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    # started in the rootdir: the node id
    here = {"started_in": "/repo", "rootdir": "/repo"}
    assert reproducer(case, [], here).endswith(f"-p no:xdist '{nodeid}'")
    # a path that is no module path, or a rootdir that is no package: the absolute file
    odd = {**case, "nodeid": "../x/test_y.py::test_z"}
    assert reproducer(odd, [], elsewhere).endswith("/x/test_y.py::test_z")
    checkout = {"started_in": str(tmp_path), "rootdir": "/repo"}
    assert reproducer(case, [], checkout).endswith(f"-p no:xdist '/repo/{nodeid}'")
    from te_conformance.reports.plugin import package_name

    assert package_name(ROOT / "suites" / "conformance") == "suites.conformance"
    assert package_name(ROOT) is None
