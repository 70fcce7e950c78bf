"""README.md's performance section is what `python -m benchmarks readme` makes of latest.json.

The section is generated (benchmarks/readme.py); these tests keep it in step with the committed
run, check that its figures are computed from the rows (small synthetic runs), and that --check
catches a README edited by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import readme
from benchmarks.compare import load

ROOT = Path(__file__).resolve().parents[1]
H100_RUN = ROOT / "benchmarks" / "runs" / "h100-2026-12-06-0238-full.json"


def softmax_row(impl: str, op: str, dtype: str, sk: int, frac: float, ms: float = 1.0, **kw):
    """A softmax row as runner.op_bandwidth writes it, before the roofline fields."""
    case = f"softmax/{op}/{dtype}/sk={sk}/{impl}"
    row = {"case": case, "section": "softmax", "impl": impl, "op": op, "dtype": dtype, "sk": sk}
    row.update(status="ok", median_ms=ms, fraction_of_ceiling=frac)
    return {**row, **kw}


def module_row(impl: str, config: str, ms: float, **kw) -> dict:
    case = f"module/{config}/bf16/{impl}"
    row = {"case": case, "section": "module", "impl": impl, "config": config, "dtype": "bf16"}
    return {**row, "shape": "b1 h2 s64 d8 bshd", "status": "ok", "median_ms": ms, **kw}


def synthetic_run() -> dict:
    """A run of a few rows whose figures are known: te_fast's forward at 91-99% of the copy
    ceiling below 16384 columns and 50% at 16384, TE twice te_fast's time, a module section."""
    fwd = "scaled_softmax_fwd"
    rows = [
        softmax_row("te_fast", fwd, "bf16", 32, 0.912),
        softmax_row("te_fast", fwd, "bf16", 64, 0.987),
        softmax_row("te_fast", fwd, "bf16", 128, 0.95),
        softmax_row("te_fast", fwd, "bf16", 16384, 0.5),
        softmax_row("te_fast", fwd, "fp16", 32, 0.93),  # 1.8 points above bf16: "within 2"
        softmax_row("te", fwd, "bf16", 32, 0.45, ms=2.0),
        softmax_row("te", fwd, "bf16", 64, 0.9, ms=0.5),
        softmax_row("te", fwd, "bf16", 32768, 0.1, status="skipped"),
        module_row("te_fast", "causal", 10.0, peak_extra_bytes=3 * 2**30),
        module_row("composite", "causal", 30.0, peak_extra_bytes=6 * 2**30),
        module_row("sdpa.cudnn", "causal", 2.0, best_fused=True, peak_extra_bytes=2**29),
        module_row("roofline", "causal", None, bound_ms=8.0, x_roofline=1.25),
    ]
    return {
        "schema": 1,
        "smoke": False,
        "state": "complete",
        "env": {"date": "2026-01-02T03:04:05+00:00", "torch": "9.9.9", "gpu": "Test GPU"},
        "command": "python -m benchmarks --only softmax,module",
        "plan": {"numel16": 64 << 20},
        "ceiling_gbps": 1000.0,
        "rows": rows,
    }


def line_of(text: str, start: str) -> str:
    (line,) = [x for x in text.splitlines() if x.startswith(start)]
    return line


def prose(text: str) -> str:
    """text with its wrapping undone."""
    return " ".join(text.split())


def test_readme_section_is_made_from_latest_json(capsys):
    """Fails when README.md's performance section is not what the command makes of
    benchmarks/latest.json: run `python -m benchmarks readme` and commit README.md."""
    from benchmarks.__main__ import main  # through the CLI: `python -m benchmarks readme --check`

    code = main(["readme", "--check"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err


def test_the_ranges_are_computed_from_the_rows():
    run = synthetic_run()
    text = readme.render(run)
    assert "Test GPU, torch 9.9.9, 2026-01-02 03:04 UTC" in prose(text)
    assert "`python -m benchmarks --only softmax,module`" in text
    assert "64M elements a case (fp32 32M); fp16 is within 2 points of bf16" in prose(text)
    assert "| op | sk 32–128 | 16384 | 32768 |" in text  # 32768: only TE's skip row, still a column
    te_fast, te = (line_of(text, f"| {x} forward, bf16") for x in ("te_fast", "TE's kernel"))
    assert te_fast == "| te_fast forward, bf16 | 91–99% | 50% | – |"
    assert te == "| TE's kernel forward, bf16 | 45–90% | – | – |"
    assert "they take rows up to 64" in prose(text)
    assert "forward plain 0.50–2.0x" in prose(text)  # TE 2.0 / 1.0 ms at 32, 0.5 / 1.0 at 64
    assert "| | causal | peak extra memory |" in text
    assert "| te_fast eager | 10.00 ms | 3.00 GiB |" in text
    assert "| unfused roofline | 8.00 ms (te_fast 1.25x) | – |" in text
    assert "| SDPA, fastest fused | 2.00 ms (cudnn) | 0.50 GiB |" in text
    assert "te_fast `torch.compile`" not in text  # not in the run: no row

    run["rows"][1]["fraction_of_ceiling"] = 0.80  # sk 64 now the slowest
    run["rows"][3]["status"] = "WRONG"
    te_fast = line_of(readme.render(run), "| te_fast forward, bf16")
    assert te_fast == "| te_fast forward, bf16 | 80–95% | **WRONG** | – |"


def test_a_newer_run_reads_the_must_move_roofline():
    """Runs with the roofline fields: the table shows fraction_of_roofline, and says so."""
    run = synthetic_run()
    run["ceilings_gbps"] = {"copy": 1000.0, "add": 1100.0, "fill": 900.0}
    for r in run["rows"]:
        if r["section"] == "softmax":
            r["fraction_of_roofline"] = r["fraction_of_ceiling"] / 2
    text = readme.render(run)
    assert "% of their must-move roofline" in prose(text)
    assert "copy 1000, add 1100, fill 900 GB/s" in prose(text)
    assert (
        line_of(text, "| te_fast forward, bf16") == "| te_fast forward, bf16 | 46–49% | 25% | – |"
    )


def test_te_ratios_pair_rows_on_the_same_tensors():
    """A square row of TE is divided by te_fast's square row, never by the plain case's."""
    run = synthetic_run()
    op = "scaled_upper_triang_masked_softmax_fwd"
    run["rows"] += [
        softmax_row("te_fast", op, "bf16", 128, 1.0, ms=4.0, config="square"),
        softmax_row("te", op, "bf16", 128, 1.0, ms=3.0, config="square"),
        softmax_row("te_fast", op, "bf16", 128, 1.0, ms=1.0),  # plain: TE has no row here
    ]
    assert "upper-triangular 0.75x" in prose(readme.render(run))


def test_check_fails_on_a_tampered_readme(tmp_path, capsys):
    real = (ROOT / "README.md").read_bytes()
    copy_ = tmp_path / "README.md"
    inside = real.replace(b"| te_fast forward, bf16 | ", b"| te_fast forward, bf16 | 1", 1)
    assert inside != real
    copy_.write_bytes(inside)
    assert readme.main(["--check", "--readme", str(copy_)]) == 1
    out = capsys.readouterr()
    assert "-| te_fast forward, bf16 | 1" in out.out and "+| te_fast forward, bf16 | " in out.out
    assert "run `python -m benchmarks readme`" in out.err
    assert copy_.read_bytes() == inside  # --check writes nothing
    assert readme.main(["--readme", str(copy_)]) == 0
    assert copy_.read_bytes() == real

    outside = real.replace(b"## Documentation", b"## Documentation (edited)")
    copy_.write_bytes(outside)
    assert readme.main(["--check", "--readme", str(copy_)]) == 0  # not the section: not its job
    assert readme.main(["--readme", str(copy_)]) == 0 and copy_.read_bytes() == outside


def test_splice_keeps_every_other_byte():
    begin, end = readme.BEGIN, readme.END
    text = f"# t\r\nkeep\r\n{begin}\r\nold\r\n{end}\r\ntail"
    assert readme.splice(text, "new\n") == f"# t\r\nkeep\r\n{begin}\r\n\nnew\n\n{end}\r\ntail"


@pytest.mark.parametrize("broken", ["no markers", "end first", "two begins"])
def test_a_readme_without_its_markers_is_refused(tmp_path, capsys, broken):
    body = {
        "no markers": "## Performance\n",
        "end first": f"{readme.END}\n{readme.BEGIN}\n",
        "two begins": f"{readme.BEGIN}\n{readme.BEGIN}\n{readme.END}\n",
    }[broken]
    path = tmp_path / "README.md"
    path.write_text(body)
    assert readme.main(["--check", "--readme", str(path)]) == 2
    assert "put them under '## Performance'" in capsys.readouterr().err
    assert path.read_text() == body


def test_a_smoke_run_is_refused(tmp_path, capsys):
    run = synthetic_run()
    run["smoke"] = True
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(run))
    assert readme.main(["--check", "--run", str(path)]) == 2
    assert "smoke run" in capsys.readouterr().err


def test_the_stored_h100_run_gives_the_table_once_typed_by_hand():
    """The ops rows of the table that README.md held by hand before it was generated, from the
    H100 run they were read off: the generator reads the rows as the hand did."""
    text = readme.render(load(H100_RUN))
    by_hand = """\
| te_fast forward, bf16 | 99–100% | 100% | 96% | 96% |
| te_fast masked forward, bf16 | 93–95% | 94% | 91% | 88% |
| te_fast backward, bf16 | 95–98% | 97% | 97% | 96% |
| TE's kernel forward, bf16 | 42–100% | 17% | – | – |
| TE's kernel masked forward, bf16 | 22–94% | 12% | – | – |
| TE's kernel backward, bf16 | 29–102% | 18% | – | – |
| te_fast forward, fp32 | 91–100% | 89% | 96% | 92% |
| te_fast masked forward, fp32 | 89–97% | 88% | 90% | 88% |
| te_fast backward, fp32 | 95–97% | 96% | 99% | 97% |
| `torch.softmax`, bf16 | 34–84% | 72% | 73% | 53% |
| inductor composite, bf16 | 78–100% | 91% | 81% | 54% |
| read-once Triton peer, bf16 | 99–100% | 100% | 95% | 59% |
"""
    head = "| op | sk 32–8192 | 16384 | 32768 | 65536 |\n|---|---:|---:|---:|---:|\n"
    assert head + by_hand in text
    assert "| te_fast eager | 17.26 ms | 18.27 ms | 19.44 ms | 5.50 GiB |" in text
    assert "(9 of 12 met on this run" in prose(text)
