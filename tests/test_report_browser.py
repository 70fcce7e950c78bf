"""report.html in headless Chromium (skipped without it; failed without it under the project's
own CI, TE_CONFORMANCE_CI=1, set by .ci/run: GitHub's or GitLab's CI=true does not require it)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from test_reports_e2e import child_env, make_suite, run_pytest

from te_conformance.reports import baseline as B
from te_conformance.reports.__main__ import main
from te_conformance.reports.browser import (
    INSTALL_HINT,
    Chromium,
    external_references,
    find_chromium,
    greenish,
    png_tag,
    tag_png,
)
from te_conformance.reports.model import load_report
from te_conformance.reports.render import outcome_counts, render, summary_line

ROOT = Path(__file__).resolve().parents[1]


def _in_ci() -> bool:
    return os.environ.get("TE_CONFORMANCE_CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        reason = f"Chromium not found ({INSTALL_HINT})"
        if _in_ci():
            pytest.fail(
                f"{reason}; TE_CONFORMANCE_CI=1: CI must run the browser test (.ci/run installs it)"
            )
        pytest.skip(reason)
    with Chromium() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def report_json(tmp_path_factory) -> Path:
    """report.json of the tiny suite (passes, a NaN failure, an error, skips, compile counters)."""
    suite = make_suite(tmp_path_factory.mktemp("tiny"))
    out = suite / "report.json"
    proc = run_pytest(suite, "--te-report", str(out))
    assert out.exists(), proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def page(report_json) -> Path:
    _, html = render(load_report(report_json), report_json.parent / "html")
    return html


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_in_chromium(browser, page, tmp_path):
    """The tiny suite's real report (tests/reports_fixtures, through the plugin and the
    renderer): no console error, nothing fetched, three plots decoded with pixels and shown,
    the verdict banner and the failure section visible; a full-page screenshot."""
    assert external_references(page.read_text()) == []
    result = browser.check(page, width=1280)
    assert result.problems(expect_failures=True) == []
    assert result.console_errors == [] and result.requests == []
    assert [i["alt"] for i in result.probe["images"]] == [
        "Worst ratio by layout x dtype", "Distribution of ratios", "Compile counters",
    ]  # fmt: skip
    assert all(i["naturalWidth"] > 200 and i["naturalHeight"] > 100 for i in result.probe["images"])
    assert result.probe["verdict"]["text"].startswith("Tests FAIL: 4 passed, 1 failed")
    assert result.probe["failures"]["text"] == "Failures (2)"
    assert result.probe["failureEntries"] == 2
    width, height = png_size(result.screenshot)
    assert width == 1280 and height > 2000  # the whole page: tables, plots, failures
    (tmp_path / "report.png").write_bytes(result.screenshot)


# A broken copy of the page: (text of the real report.html, its replacement) -> the problems
# the checks must report (each a substring of one problem).
LOGO = '<img alt="logo" src="https://example.invalid/logo.png">'
BROKEN = {
    "console_error": (
        ("</body>", "<script>console.error('boom from the fixture')</script></body>"),
        ["console error: console.error: boom from the fixture"],
    ),
    "exception": (
        ("</body>", "<script>null.x</script></body>"),
        ["console error: uncaught: TypeError"],
    ),
    "broken_image": (
        ('src="data:image/png;base64,', 'src="data:image/png;base64,AAAA'),
        ["image 'Worst ratio by layout x dtype'", "did not decode"],
    ),
    "external_image": (
        ("</body>", LOGO + "</body>"),
        [
            "external URL in the file: https://example.invalid/logo.png",
            "request beyond the file: https://example.invalid/logo.png",
            "image 'logo' (https://example.invalid/logo.png...) did not decode",
        ],
    ),
    "css_import": (
        ("<style>", "<style>@import url('https://example.invalid/x.css');"),
        [
            "external URL in the file: https://example.invalid/x.css",
            "request beyond the file: https://example.invalid/x.css",
        ],
    ),
    "script_fetch": (  # invisible to the static check: only the browser sees it
        ("</body>", "<script>fetch('https:' + '//example.invalid/t')</script></body>"),
        ["request beyond the file: https://example.invalid/t"],
    ),
    "hidden_verdict": (
        ("</style>", ".verdict { display: none }</style>"),
        ["the verdict banner (.verdict) is not visible"],
    ),
    "hidden_failures": (
        ("</style>", "h2 { visibility: hidden }</style>"),
        ["the failure section is not visible"],
    ),
    "flat_plots": (
        ("</style>", "img { height: 0 }</style>"),
        ["image 'Compile counters'", "takes no space on the page"],
    ),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_checks_catch_a_broken_page(browser, page, tmp_path, breakage):
    (old, new), expected = BROKEN[breakage]
    text = page.read_text()
    assert old in text, old
    broken = tmp_path / "report.html"
    broken.write_text(text.replace(old, new, 1))
    problems = browser.check(broken, width=1280, full_page=False).problems(expect_failures=True)
    for want in expected:
        assert any(want in p for p in problems), (want, problems)


def test_static_check_sees_what_loads_and_not_what_is_text():
    page = """<html><head><link rel="stylesheet" href="//cdn.example/x.css">
    <style>body { background: url("bg.png") } .a { background: url(data:image/png,A) }</style>
    </head><body><p>see https://example.invalid/doc (text, never fetched)</p><a href="#top">up</a>
    <img srcset="a.png 1x, https://example.invalid/b.png 2x" src="data:image/png;base64,AA">
    <div style="background-image: url('https://example.invalid/c.png')"></div></body></html>"""
    assert external_references(page) == [
        "//cdn.example/x.css", "bg.png", "a.png", "https://example.invalid/b.png",
        "https://example.invalid/c.png",
    ]  # fmt: skip


def test_screenshot_command_checks_the_page_and_writes_the_png(browser, report_json, tmp_path):
    """`python -m te_conformance screenshot` (how docs/report_h100.png is made): the first
    viewport."""
    out = tmp_path / "docs" / "shot.png"
    assert main(["screenshot", str(report_json), "-o", str(out), "--height", "900"]) == 0
    assert png_size(out.read_bytes()) == (1280, 900)
    tag = png_tag(out.read_bytes())
    assert tag["report"] == str(report_json)
    assert tag["summary"] == summary_line(load_report(report_json))


def _one_pixel_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\0\xff\x00\x00")  # filter byte, one red pixel
    chunks = chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


def test_png_tag_round_trip():
    png = _one_pixel_png()
    assert png_tag(png) is None
    tagged = tag_png(png, {"summary": "x"})
    assert png_tag(tagged) == {"summary": "x"} and png_size(tagged) == png_size(png)
    assert png_tag(tagged.replace(b"te-conformance-report", b"something-else-here!!")) is None


def test_readme_screenshot_shows_the_current_gpu_baseline():
    """docs/report_h100.png is the screenshot command's picture of the GPU run that made
    reports/baseline/h100.json (that run's report.json is not committed: the baseline keeps what
    it judged, compactly), and records which run it shows: a new baseline needs a new picture."""
    regenerate = (
        "python -m te_conformance screenshot <that run's report.json> -o docs/report_h100.png"
    )
    tag = png_tag((ROOT / "docs" / "report_h100.png").read_bytes())
    assert tag is not None, f"docs/report_h100.png does not say what it shows; run: {regenerate}"
    made = B.load(ROOT / "reports" / "baseline" / "h100.json").made_from
    assert tag["date_utc"] == made["date_utc"], f"docs/report_h100.png is out of date: {regenerate}"
    counts = outcome_counts(made["summary"])
    assert f": {counts} of {made['summary']['total']} cases" in tag["summary"], tag["summary"]


@pytest.mark.parametrize(
    "ci,outcome",
    [({}, "1 skipped"), ({"CI": "true"}, "1 skipped"), ({"TE_CONFORMANCE_CI": "1"}, "1 error")],
)
def test_without_chromium_the_test_skips_but_not_in_ci(ci, outcome):
    """TE_CHROMIUM naming no executable stands for a machine without Chromium. Only the project's
    CI (TE_CONFORMANCE_CI=1, .ci/run) requires the browser; GitHub's or GitLab's CI=true doesn't."""
    test = f"{Path(__file__).name}::test_report_in_chromium"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
           "-rs", test]  # fmt: skip
    env = {k: v for k, v in child_env(TE_CHROMIUM="/nonexistent/chromium").items()
           if k not in ("CI", "TE_CONFORMANCE_CI")}  # fmt: skip
    env.update(ci)
    proc = subprocess.run(cmd, cwd=Path(__file__).parent, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert outcome in proc.stdout, proc.stdout[-3000:]
    assert "Chromium not found (install Debian's chromium: apt-get install -y chromium)" in (
        proc.stdout
    )


def test_a_fail_verdict_is_never_shown_green(browser, report_json, tmp_path):
    """A run whose cases all pass but that regressed against its baseline: the stored verdict is
    FAIL, and the banner must not be green (a copy styled green is caught)."""
    report = load_report(report_json)
    report["cases"] = [c for c in report["cases"] if c["outcome"] not in ("failed", "error")]
    report["verdict"] = {"status": "FAIL", "passed": False, "exit_code": 1, "overrides": [],
                         "reasons": ["1 regression(s) against reports/baseline/cpu.json"],
                         "notes": []}  # fmt: skip
    _, page = render(report, tmp_path / "fail")
    result = browser.check(page, width=1280, full_page=False)
    assert result.problems(expect_failures=False) == []
    assert result.probe["verdict"]["text"].startswith("Verdict: FAIL — 1 regression(s)")
    assert not greenish(result.probe["verdictColours"]["background"])
    green = tmp_path / "green.html"
    green.write_text(page.read_text().replace("</style>", ".FAIL { background: #d8f0d8 }</style>"))
    problems = browser.check(green, width=1280, full_page=False).problems(expect_failures=False)
    assert any("a FAIL verdict is shown green" in p for p in problems), problems
