"""The benchmark harness on the CPU: the smoke run end to end, and wrong results marked WRONG."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

te_fast = pytest.importorskip("te_fast")
if te_fast.UNAVAILABLE_REASON is not None:
    pytest.skip(f"te_fast unavailable: {te_fast.UNAVAILABLE_REASON}", allow_module_level=True)

from benchmarks import checks  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402
from benchmarks.cases import SOFTMAX_OPS, parse_count, parse_list  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {"ceiling", "softmax", "convert", "module", "small", "stack"}
ROW_KEYS = {"case", "section", "impl", "status", "t_s"}


def _run(tmp_path, *args):
    code = main(["--smoke", "--out", str(tmp_path), *args])
    result = json.loads((tmp_path / "latest.json").read_text())
    return code, result


def test_smoke_run_writes_every_section(tmp_path, capsys):
    code, result = _run(tmp_path)
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "harness OK" in printed
    assert " ms " not in printed, "smoke timings must not be printed as results"
    assert result["smoke"] is True and result["state"] == "complete"
    for key in ("env", "command", "plan", "ceiling_gbps", "total_wall_s", "compiles", "rows"):
        assert key in result, key
    assert result["env"]["torch"] == torch.__version__
    assert result["ceiling_gbps"] > 0
    rows = result["rows"]
    assert {r["section"] for r in rows} == SECTIONS
    assert len({r["case"] for r in rows}) == len(rows), "case keys must be unique"
    for r in rows:
        assert ROW_KEYS <= set(r), r
        assert r["status"] in ("ok", "skipped"), r
    ops = {(r["op"], r["dtype"], r["sk"]) for r in rows if r["impl"] == "te_fast" and "sk" in r}
    for op in SOFTMAX_OPS:
        for name in (f"{op.fwd}_fwd", op.bwd):
            for dtype in ("fp32", "bf16"):
                for sk in (64, 128):
                    assert (name, dtype, sk) in ops
    for r in rows:
        if r["section"] in ("softmax", "convert") and r["status"] == "ok":
            assert r["bytes"] > 0 and r["fraction_of_ceiling"] > 0 and r["check"]["ok"], r
    # the ceilings by read:write mix, and every softmax row against its must-move roofline
    assert set(result["ceilings_gbps"]) == {"copy", "add", "fill"}
    assert result["ceilings_gbps"]["copy"] == result["ceiling_gbps"]
    ceilings = {r["impl"]: r for r in rows if r["section"] == "ceiling"}
    assert set(ceilings) == {"copy", "add", "fill"}
    assert all(r["gbps"] == pytest.approx(result["ceilings_gbps"][k]) for k, r in ceilings.items())
    softmax = [r for r in rows if r["section"] == "softmax" and r["status"] == "ok"]
    for r in softmax:
        assert r["must_move_bytes"] == r["read_bytes"] + r["write_bytes"] > 0, r
        assert r["full_row_bytes"] == r["bytes"] >= r["must_move_bytes"], r
        assert r["fraction_of_roofline"] == pytest.approx(r["roofline_ms"] / r["median_ms"])
        causal = "causal" in r["op"] or "upper_triang" in r["op"]
        assert (r["must_move_bytes"] < r["full_row_bytes"]) == causal, r
    # the square causal cases: te_fast's causal ops on [b, h, s, s]
    square = {(r["op"], r["dtype"], r["sk"]) for r in softmax if r.get("config") == "square"}
    for op in SOFTMAX_OPS:
        for name in (f"{op.fwd}_fwd", op.bwd):
            causal = op.masking in ("upper_triang", "aligned_causal")
            assert ((name, "bf16", 32) in square) == causal
    timed = [
        r
        for r in rows
        if r["section"] in ("module", "small", "stack") and r["status"] == "ok"
        and r["impl"] != "roofline" and r.get("config") != "thd"  # no composite beside them
    ]  # fmt: skip
    assert {r["impl"] for r in timed} >= {"te_fast", "te_fast.compile", "composite", "sdpa.math"}
    assert all("speedup" in r and r["check"]["ok"] for r in timed)
    assert all("wall_ms" in r for r in timed if r["section"] in ("small", "stack"))
    # te_fast's eager rows of the host-bound sections carry their rounds paired with the composite
    paired = [r for r in timed if "paired_ratio" in r]
    assert sorted((r["section"], r["impl"]) for r in paired) == [
        ("small", "te_fast"),
        ("stack", "te_fast"),
    ]
    assert all(r["paired_q1"] <= r["paired_ratio"] <= r["paired_q3"] for r in paired)
    assert [c for c in result["compiles"] if c["label"].startswith("module/")]
    md = (tmp_path / "latest.md").read_text()
    assert "SMOKE" in md and "scaled_softmax_fwd, bf16" in md and "Stack of layers" in md
    assert "## Softmax ops: % of the must-move roofline" in md
    assert "## Causal ops on square tensors" in md and "| 32 | [2,2,32,32] |" in md
    assert md.count("Paired rounds, te_fast / composite (eager") == 2  # small and stack
    assert (tmp_path / "latest.png").stat().st_size > 1000


def test_roofline_bytes_and_bound_by_hand():
    """b2 h3 s4 d5, 2-byte elements: n = 2*3*4*4 = 96 scores of 192 bytes. Full rows: softmax
    forward reads and writes 192 (384), backward reads 2*192 and writes 192 (576). Causal (top-left,
    s = 4): 1 + 2 + 3 + 4 = 10 kept of 16 a slice, 60 of 96: forward reads 120 and writes 192
    (312), backward reads 240 and writes 192 (432); the old count 960 either way. THD with t = 6
    tokens, a token row of 3*5*2 = 30 bytes: thd->bshd (6 + 2*4)*30 = 420, bshd->thd 2*6*30 =
    360; forward q, k, v in and out back 3*420 + 360 = 1620, backward dout in and dq, dk, dv back
    420 + 3*360 = 1500."""
    from benchmarks.cases import AttnShape
    from benchmarks.module_bench import (
        gaps,
        gemm_flops,
        roofline,
        roofline_bytes,
        softmax_traffic_of,
    )

    shape = AttnShape(2, 3, 4, 5)
    thd = roofline_bytes(shape, 2, 6, "none")
    assert thd == {"softmax_fwd_bytes": 384, "softmax_bwd_bytes": 576,
                   "softmax_full_row_bytes": 960,
                   "convert_fwd_bytes": 1620, "convert_bwd_bytes": 1500}  # fmt: skip
    causal = roofline_bytes(shape, 2, None, "upper_triang")
    assert causal == {"softmax_fwd_bytes": 312, "softmax_bwd_bytes": 432,
                      "softmax_full_row_bytes": 960,
                      "convert_fwd_bytes": 0, "convert_bwd_bytes": 0}  # fmt: skip
    assert roofline_bytes(shape, 4, None, "none")["softmax_fwd_bytes"] == 768
    assert gemm_flops(shape) == 6 * 2 * 2 * 3 * 4 * 4 * 5
    # ceilings of 1, 2 and 4 bytes a millisecond (1e-6 GB/s is 1000 bytes a second)
    ceilings = {"copy": 1e-6, "add": 2e-6, "fill": 4e-6}
    # full rows: the forward a copy of 384 bytes (384 ms), the backward an add of 576 (288 ms);
    # the conversions' 3120 bytes at the copy ceiling
    terms = roofline(2.5, softmax_traffic_of(shape, 2, "none"), 3120, ceilings, 1.0)
    assert terms == pytest.approx(
        {"gemm_ms": 2.5, "softmax_ms": 672.0, "convert_ms": 3120.0, "bound_ms": 3794.5,
         "kept_tile_fraction": 1.0, "tile_bound_ms": 3794.5}
    )  # fmt: skip
    # causal: the forward a copy of the 120 read bytes (240 ms) + a fill of 72 (18 ms); the
    # backward an add of 48 written bytes (144 moved, 72 ms) + a copy of 144 (288 moved, 288 ms)
    terms = roofline(2.5, softmax_traffic_of(shape, 2, "upper_triang"), 0, ceilings, 0.5)
    assert terms == pytest.approx(
        {"gemm_ms": 2.5, "softmax_ms": 618.0, "convert_ms": 0.0, "bound_ms": 620.5,
         "kept_tile_fraction": 0.5, "tile_bound_ms": 619.25}
    )  # fmt: skip
    small = {"gemm_ms": 4.0, "softmax_ms": 1.0, "convert_ms": 0.25, "bound_ms": 5.25}
    profile = {"gemm": 5.0, "softmax": 2.5, "convert": 0.5, "other": 0.5}
    got = gaps(10.0, profile, small)
    assert got["gap_ms"] == pytest.approx(
        {"gemm": 1.0, "softmax": 1.5, "convert": 0.25, "other_kernels": 0.5, "no_kernel": 1.5}
    )
    assert sum(got["gap_ms"].values()) == pytest.approx(10.0 - 5.25)
    assert got["largest_gap"] == "softmax"


def test_unfused_gemms_are_checked(monkeypatch):
    """The roofline's GEMMs are checked against float64 before they are timed: GEMMs that write
    zeros fail the check."""
    from benchmarks.cases import AttnShape
    from benchmarks.module_bench import unfused_gemms

    step, check = unfused_gemms(AttnShape(2, 2, 16, 8), "bf16", torch.device("cpu"), 0.3)
    assert check().ok
    monkeypatch.setattr(torch, "bmm", lambda a, b, *, out: out.zero_())
    assert not check().ok


def test_smoke_run_has_the_roofline_rows(tmp_path, capsys):
    """The module section's roofline: one row per config (causal, padding, thd) with its terms,
    bytes by roofline_bytes at the smoke shape (causal: the kept lower triangle), both bounds
    (full GEMMs; GEMMs on the kept tiles only), te_fast's time as a multiple of each; te_fast
    at THD timed and checked; both tables in latest.md."""
    from benchmarks.cases import AttnShape
    from benchmarks.module_bench import ROOFLINE_MASKING, roofline_bytes, softmax_traffic_of
    from benchmarks.roofline import roofline_ms

    code, result = _run(tmp_path, "--only", "module")
    assert code == 0, capsys.readouterr().out
    rows = {r["case"]: r for r in result["rows"]}
    thd = rows["module/thd/bf16/te_fast"]
    assert thd["status"] == "ok" and thd["check"]["ok"] and thd["median_ms"] > 0
    t = thd["tokens"]
    assert "thd" in thd["shape"] and 16 <= t <= 32  # b2 s16, lengths in [8, 16]
    shape = AttnShape(2, 2, 16, 8)  # cases.smoke_plan's module shape
    ceilings = result["ceilings_gbps"]
    for config in ("causal", "padding", "thd"):
        r = rows[f"module/{config}/bf16/roofline"]
        assert r["status"] == "ok"
        masking = ROOFLINE_MASKING[config]
        nbytes = roofline_bytes(shape, 2, t if config == "thd" else None, masking)
        assert {k: r[k] for k in nbytes} == nbytes
        n = 2 * 2 * 16 * 16 * 2  # the scores' bytes
        assert r["softmax_full_row_bytes"] == 5 * n
        kept = 2 * 2 * (16 * 17 // 2) * 2 if config == "causal" else n  # kept scores' bytes
        assert r["softmax_fwd_bytes"] == kept + n and r["softmax_bwd_bytes"] == 2 * kept + n
        assert r["convert_fwd_bytes"] > 0 if config == "thd" else r["convert_fwd_bytes"] == 0
        assert r["ceiling_gbps"] == result["ceiling_gbps"] == ceilings["copy"] > 0
        assert r["bound_ms"] == pytest.approx(r["gemm_ms"] + r["softmax_ms"] + r["convert_ms"])
        assert r["softmax_ms"] == pytest.approx(
            sum(roofline_ms(x.read_bytes, x.write_bytes, ceilings)[0]
                for x in softmax_traffic_of(shape, 2, masking))
        )  # fmt: skip
        assert r["kept_tile_fraction"] == 1.0  # s = 16: one 128x128 tile, kept
        assert r["tile_bound_ms"] == pytest.approx(
            r["gemm_ms"] * r["kept_tile_fraction"] + r["softmax_ms"] + r["convert_ms"]
        )
        ours = thd if config == "thd" else rows[f"module/{config}/bf16/te_fast"]
        assert r["te_fast_ms"] == ours["median_ms"]
        assert r["x_roofline"] == pytest.approx(ours["median_ms"] / r["bound_ms"])
        assert r["x_tile_bound"] == pytest.approx(ours["median_ms"] / r["tile_bound_ms"])
        assert ours["x_roofline"] == r["x_roofline"] and ours["x_tile_bound"] == r["x_tile_bound"]
    assert "x_roofline" in rows["module/causal/bf16/te_fast.compile"]
    md = (tmp_path / "latest.md").read_text()
    assert "## The unfused rooflines" in md and "| x roofline | x tile |" in md
    assert "| tile bound ms |" in md
    assert "| bf16 | thd (b2 h2 s16 d8 thd t=" in md


def test_te_runs_on_te_fasts_tensors(tmp_path, monkeypatch, capsys):
    """te_peer: TE's ops run on the very tensors te_fast's do (same storage, same shape), the
    upper-triangular one only where sq == sk (the square cases; a skip row with TE's reason
    elsewhere), and TE's rows count the bytes te_fast's do. TE is stood in for by its own shape
    rules (te_kernels.not_supported_reasons) and te_fast's arithmetic."""
    from benchmarks import te_peer
    from te_conformance.suites.adapters import te_kernels

    inputs: dict[str, set] = {}  # "te_fast"/"te" -> {(op, data_ptr, shape)}
    real = {op.name: getattr(te_fast.ops, op.fwd) for op in SOFTMAX_OPS}

    def seen(who, op, x):
        inputs.setdefault(who, set()).add((op, x.data_ptr(), tuple(x.shape)))

    class FakeTE:
        unavailable_reason = staticmethod(lambda: None)
        not_supported_reasons = staticmethod(te_kernels.not_supported_reasons)
        fault_reasons = staticmethod(te_kernels.fault_reasons)

        @staticmethod
        def forward(op, x, *args):
            seen("te", op, x)
            return real[op](x, *args)

        @staticmethod
        def backward(op, dy, y, scale):
            return getattr(te_fast.ops, f"{op}_bwd")(dy, y, scale)

    def spy(name):
        def fwd(x, *args):
            seen("te_fast", name, x)
            return real[name](x, *args)

        return fwd

    for op in SOFTMAX_OPS:
        monkeypatch.setattr(te_fast.ops, op.fwd, spy(op.name))
    monkeypatch.setattr(te_peer, "_te", lambda: FakeTE)
    code, result = _run(tmp_path, "--only", "softmax", "--peers", "te", "--inductor", "off")
    assert code == 0, capsys.readouterr().out
    assert inputs["te"] and inputs["te"] <= inputs["te_fast"]
    rows = {r["case"]: r for r in result["rows"]}
    upper = "scaled_upper_triang_masked_softmax"
    for s in (16, 32):  # the smoke plan's square sizes: TE and te_fast on [b*h, s, s]
        for name in (f"{upper}_fwd", f"{upper}_bwd", "scaled_aligned_causal_masked_softmax_bwd"):
            ours, te = (rows[f"softmax/{name}/square/bf16/sk={s}/{i}"] for i in ("te_fast", "te"))
            assert ours["status"] == te["status"] == "ok", te
            for key in ("shape", "read_bytes", "write_bytes", "full_row_bytes"):
                assert te[key] == ours[key], key
    assert any(op == upper and shape[1] == shape[2] for op, _, shape in inputs["te"])
    assert not any(op == upper and shape[1] != shape[2] for op, _, shape in inputs["te"])
    skipped = rows[f"softmax/{upper}_fwd/bf16/sk=64/te"]  # [4, 32, 64]: sq != sk
    assert skipped["status"] == "skipped" and "sq == sk required" in skipped["note"]
    assert rows["softmax/scaled_softmax_fwd/bf16/sk=64/te"]["status"] == "ok"


def _unnormalised(x, scale):
    return torch.softmax(x.float() * scale, -1).to(x.dtype) * 1.5


def _ignores_mask(x, mask, scale):
    return torch.softmax(x.float() * scale, -1).to(x.dtype)


def _not_causal(x, scale):
    return torch.softmax(x.float() * scale, -1).to(x.dtype)


def _zero_grad(dy, y, scale):
    return torch.zeros_like(y)


@pytest.mark.parametrize(
    "op, broken, bad_case",
    [
        ("scaled_softmax", _unnormalised, "softmax/scaled_softmax_fwd/"),
        ("scaled_masked_softmax", _ignores_mask, "softmax/scaled_masked_softmax_fwd/"),
        # its backward, fed the broken y, may be WRONG too (one that reads only kept columns is)
        ("scaled_aligned_causal_masked_softmax", _not_causal, "aligned_causal_masked_softmax_"),
        ("scaled_softmax_bwd", _zero_grad, "softmax/scaled_softmax_bwd/"),
    ],
)
def test_wrong_op_is_marked_wrong(tmp_path, monkeypatch, capsys, op, broken, bad_case):
    monkeypatch.setattr(te_fast.ops, op, broken)
    code, result = _run(tmp_path, "--only", "softmax")
    assert code == 1
    wrong = [r for r in result["rows"] if r["status"] == "WRONG"]
    assert wrong and all(bad_case in r["case"] for r in wrong), [r["case"] for r in wrong]
    assert "!!! WRONG" in capsys.readouterr().out
    assert "**WRONG**" in (tmp_path / "latest.md").read_text()


def test_wrong_module_is_marked_wrong(tmp_path, monkeypatch):
    """The module's causal path goes through the upper-triangular op: break it where the module
    takes it from (te_fast/_eager_softmax.py: its table of forward and backward ops, and the C++
    autograd node that calls the forward by name when a gradient is wanted)."""
    from te_fast import _eager_softmax

    name = "scaled_upper_triang_masked_softmax_fwd"
    monkeypatch.setitem(_eager_softmax._PAIRS, name, (_not_causal, _eager_softmax._PAIRS[name][1]))
    eager_softmax = _eager_softmax._EAGER_SOFTMAX

    def broken_eager(fwd, x, mask, scale, rows):
        y = eager_softmax(fwd, x, mask, scale, rows)
        if fwd != name:
            return y
        return y + (_not_causal(x.detach(), scale) - y.detach())  # not causal, y's autograd

    monkeypatch.setattr(_eager_softmax, "_EAGER_SOFTMAX", broken_eager)
    code, result = _run(tmp_path, "--only", "small")
    assert code == 1
    status = {r["impl"]: r["status"] for r in result["rows"]}
    assert status["te_fast"] == "WRONG" and status["composite"] == "ok"


def test_raising_op_is_an_error_and_the_run_goes_on(tmp_path, monkeypatch):
    def boom(*args):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(te_fast.ops, "convert_thd_to_bshd", boom)
    code, result = _run(tmp_path, "--only", "convert")
    assert code == 1
    by_op = {(r.get("op"), r.get("dtype")): r for r in result["rows"]}
    assert by_op[("convert_thd_to_bshd", "bf16")]["status"] == "ERROR"
    assert "kernel exploded" in by_op[("convert_thd_to_bshd", "bf16")]["note"]
    assert by_op[("convert_bshd_to_thd", "bf16")]["status"] == "ok"


def test_deadline_skips_loudly(tmp_path, capsys):
    code, result = _run(tmp_path, "--only", "convert", "--deadline-s", "0")
    assert code == 0
    assert all(r["status"] == "skipped" for r in result["rows"] if r["section"] == "convert")
    assert "!!! DEADLINE" in capsys.readouterr().out


def test_gpu_run_without_cuda_refuses(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["--only", "softmax"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_bad_arguments_refuse(capsys):
    assert main(["--smoke", "--dtypes", "fp8"]) == 2
    assert "--dtypes" in capsys.readouterr().err


def test_checks_catch_small_relative_errors():
    ref = torch.softmax(torch.randn(4, 65536), -1)  # ~1.5e-5 per element
    assert checks.check(ref.bfloat16(), ref, checks.OP_BOUND[torch.bfloat16]).ok
    assert not checks.check(ref * 1.2, ref, checks.OP_BOUND[torch.bfloat16]).ok
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert not checks.check(nan, ref, 1.0).ok
    assert not checks.check(ref[:, :10], ref, 1.0).ok


def test_fully_masked_rows_are_zero_in_the_reference():
    x = torch.randn(3, 4)
    masked = torch.tensor([[True] * 4, [False, True, True, True], [False] * 4])
    y = checks.softmax_ref(x, 1.0, masked)
    assert torch.equal(y[0], torch.zeros(4)) and float(y[1, 0]) == 1.0


def test_parse_helpers():
    assert parse_count("256M") == 256 << 20 and parse_count("1024") == 1024
    assert parse_list("bf16, fp16", ("bf16", "fp16", "fp32"), "x") == ("bf16", "fp16")
    with pytest.raises(ValueError):
        parse_list("", ("a",), "x")


@pytest.mark.parametrize("op", SOFTMAX_OPS, ids=lambda op: op.name)
def test_op_checks_with_more_rows_than_columns(op):
    """The GPU shapes at short rows have sq >> sk: aligned-causal rows i < sq - sk are fully
    masked (sum 0), the rest sum to 1. A real te_fast result passes, a zeroed row fails even
    where the sampled rows do not reach it."""
    from benchmarks.checks import check_bwd, check_fwd

    b, h, sq, sk, scale = 2, 3, 40, 16, 0.3
    x = torch.randn(b, h, sq, sk, dtype=torch.bfloat16)
    mask = torch.rand(b, 1, sq, sk) < 0.5
    mask[0, 0, 3] = True  # one fully masked row
    xin = x.view(b * h, sq, sk) if op.rank == 3 else x
    fwd = getattr(te_fast.ops, op.fwd)
    y = fwd(xin, mask, scale) if op.masking == "mask" else fwd(xin, scale)
    y4 = y.view(b, h, sq, sk)
    assert check_fwd(y4, x, mask, op.masking, scale).ok
    dy = torch.randn_like(y)
    dx = getattr(te_fast.ops, op.bwd)(dy, y, scale)
    assert check_bwd(dx.view(b, h, sq, sk), dy.view(b, h, sq, sk), y4, scale).ok
    broken = y4.clone()
    broken[1, 0, 30] = 0  # block (1, 0) is not sampled; row 30 keeps columns in every op
    assert not check_fwd(broken, x, mask, op.masking, scale).ok


def test_cuda_error_stops_the_run_and_keeps_the_results(tmp_path, monkeypatch, capsys):
    def poisoned(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(te_fast.ops, "convert_bshd_to_thd", poisoned)
    code, result = _run(tmp_path, "--only", "convert,small")
    assert code == 3
    assert result["state"] == "stopped"
    assert not [r for r in result["rows"] if r["section"] == "small"], "nothing after the error"
    assert [r for r in result["rows"] if r["status"] == "ok" and r["section"] == "convert"]
    assert "!!! STOPPED" in capsys.readouterr().out
    assert (tmp_path / "latest.md").exists()


def test_harness_crash_keeps_the_results(tmp_path, monkeypatch, capsys):
    from benchmarks import module_bench

    def crash(r):
        raise KeyError("harness bug")

    monkeypatch.setattr(module_bench, "run_small", crash)
    code, result = _run(tmp_path, "--only", "convert,small")
    assert code == 3 and result["state"] == "crashed"
    assert [r for r in result["rows"] if r["section"] == "convert"]
    assert "!!! CRASHED" in capsys.readouterr().out


# ----------------------------------------------------------------------------- A/B table


def _ab_run(tmp_path, name: str, rows: list[dict], ceiling: float = 4000.0) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"ceiling_gbps": ceiling, "rows": rows}))
    return f"{name}={path}"


def _softmax_row(fraction: float, status: str = "ok", impl: str = "te_fast") -> dict:
    case = f"softmax/scaled_softmax_fwd/bf16/sk=128/{impl}"
    return {"case": case, "impl": impl, "status": status, "fraction_of_ceiling": fraction}


def test_ab_table_medians_and_changes(tmp_path, capsys):
    """tools/gpu/ab_table.py: one column per run, the median per build (A1, A2 -> A) and the
    change from the first build, in points; a run's failed row shows as "-!" and is left out."""
    from tools.gpu import ab_table as ab

    module = {"case": "module/causal/bf16/te_fast", "impl": "te_fast", "status": "ok",
              "speedup": 3.0}  # fmt: skip
    peer = _softmax_row(0.99, impl="torch")
    runs = [
        _ab_run(tmp_path, "A1", [_softmax_row(0.80), module, peer]),
        _ab_run(tmp_path, "B1", [_softmax_row(0.90), dict(module, speedup=3.3)]),
        _ab_run(tmp_path, "A2", [_softmax_row(0.84), module]),
        _ab_run(tmp_path, "B2", [_softmax_row(0.70, status="WRONG"), dict(module, speedup=3.1)]),
    ]
    assert ab.main(runs) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "scaled_softmax_fwd" in x)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:] == ["80.0", "90.0", "84.0", "-!", "82.0", "90.0", "+8.0"]
    line = next(x for x in out.splitlines() if "module/causal" in x)
    assert line.rstrip().endswith("| 3.00x | 3.20x | +0.20x |")
    assert "/torch" not in out  # te_fast's rows only, unless --impl
    assert ab.main([*runs, "--impl", "torch"]) == 0
    assert "/torch" in capsys.readouterr().out


def test_ab_bad_arguments_exit_2(tmp_path, capsys):
    from tools.gpu import ab_table as ab

    good = _ab_run(tmp_path, "A1", [_softmax_row(0.8)])
    assert ab.main([good, "B1"]) == 2  # no =PATH
    assert ab.main([good, good]) == 2  # the same name twice
    assert ab.main([good, f"B1={tmp_path / 'missing.json'}"]) == 2
    (tmp_path / "bad.json").write_text("{}")
    assert ab.main([good, f"B1={tmp_path / 'bad.json'}"]) == 2
    capsys.readouterr()


def test_gpu_ab_refuses_cleanly_without_a_gpu(tmp_path):
    """tools/gpu/ab.sh: usage and argument errors (candidates included), and no CUDA device, all
    exit 2 with a reason (before copying or building anything)."""
    script = ROOT / "tools" / "gpu" / "ab.sh"
    base = tmp_path / "base"
    (base / "csrc").mkdir(parents=True)
    env = dict(os.environ, OUT=str(tmp_path / "out"), AB_WORK=str(tmp_path / "work"))

    def run(*args):
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                              env=env, timeout=120)  # fmt: skip

    assert run().returncode == 2
    missing = run(str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "is not a folder" in missing.stderr
    rounds = run(str(base), "--rounds", "0")
    assert rounds.returncode == 2 and "positive count" in rounds.stderr
    no_count = run(str(base), "--rounds")
    assert no_count.returncode == 2 and "positive count" in no_count.stderr
    candidate = run(str(base), str(base), str(tmp_path / "nothing"))
    assert candidate.returncode == 2 and "nothing/csrc is not a folder" in candidate.stderr
    many = run(*[str(base)] * 8)  # a base and seven candidates
    assert many.returncode == 2 and "at most six candidates" in many.stderr
    unknown = run(str(base), "--round", "2")
    assert unknown.returncode == 2 and "unknown argument --round" in unknown.stderr
    if not torch.cuda.is_available():
        done = run(str(base))
        assert done.returncode == 2 and "no CUDA device" in done.stderr
        assert not (tmp_path / "work").exists()


def test_misaligned_run_names_its_rows_and_offsets_its_inputs(tmp_path, capsys):
    """--misaligned: softmax inputs one element past an aligned address (so that te_fast takes
    its one-element kernels on a GPU), rows named .../misaligned/..., results still checked."""
    from benchmarks.softmax_case import _one_element_in

    t = torch.randn(3, 5, dtype=torch.bfloat16)
    moved = _one_element_in(t)
    assert torch.equal(moved, t) and moved.is_contiguous()
    assert moved.data_ptr() % 16 == t.element_size()  # allocations are 16-byte aligned at least
    code, result = _run(tmp_path, "--only", "softmax", "--misaligned")
    assert code == 0, capsys.readouterr().out
    rows = [r for r in result["rows"] if r["section"] == "softmax"]
    assert rows and all("/misaligned/" in r["case"] and r["status"] == "ok" for r in rows)
    assert all(r["check"]["ok"] for r in rows)


def test_profile_stack_plumbing(capsys):
    """tools/gpu/profile_stack.py: both stacks, wall clock and the host profile, on the CPU (no
    kernels there); a mode it does not know is refused."""
    import sys

    sys.path.insert(0, str(ROOT / "tools" / "gpu"))
    import profile_stack

    args = ["--shape", "tiny", "--layers", "1", "--modes", "eager", "--rounds", "2", "--host"]
    assert profile_stack.main(args) == 0
    out = capsys.readouterr().out
    for name in ("te_fast", "composite"):
        assert f"{name} eager: " in out and " us wall/step" in out
    assert "host (cProfile" in out and "us/step in Python" in out
    with pytest.raises(SystemExit):
        profile_stack.main(["--modes", "fast"])
    capsys.readouterr()


def test_paired_wall_times_each_side_in_turn():
    """timing.paired_wall: the median ratio a / b over rounds of blocks of each, alternating."""
    import time

    from benchmarks.timing import paired_wall

    calls = []

    def a():
        calls.append("a")
        time.sleep(0.02)

    def b():
        calls.append("b")
        time.sleep(0.01)

    p = paired_wall(a, b, torch.device("cpu"), rounds=5, block=2)
    # 2x by construction; a loaded machine's late wake-ups (a few ms) move a round, not the median
    assert p.rounds == 5 and 1.4 < p.ratio < 2.8 and p.q1 <= p.ratio <= p.q3
    assert "".join(calls) == "aabb" + "bbaa" + "aabb" + "bbaa" + "aabb"  # blocks, alternating


def test_host_overhead_tool_runs(capsys):
    from benchmarks import host_overhead

    assert (
        host_overhead.main(["--layers", "1", "--rounds", "2", "--block", "1", "--dtype", "fp32"])
        == 0
    )
    out = capsys.readouterr().out
    assert "te_fast" in out and "composite" in out and "paired ratio" in out
    if not torch.cuda.is_available():  # the GPU form says so, and exits 2, on a CPU machine
        assert host_overhead.main(["--device", "cuda", "--rounds", "2"]) == 2
        assert "needs a CUDA device" in capsys.readouterr().out
