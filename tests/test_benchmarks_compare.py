"""python -m benchmarks compare on synthetic results: falls of more than 10% fail, nothing else."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import main
from benchmarks.compare import compare


def bw(case, fraction, status="ok"):
    return {"case": case, "section": "softmax", "impl": "te_fast", "status": status,
            "fraction_of_ceiling": fraction, "median_ms": 0.2}  # fmt: skip


def mod(case, speedup, status="ok"):
    return {"case": case, "section": "module", "impl": "te_fast", "status": status,
            "speedup": speedup, "median_ms": 20.0}  # fmt: skip


CEILING = {"case": "ceiling/copy", "section": "ceiling", "impl": "copy", "status": "ok",
           "fraction_of_ceiling": 1.0}  # fmt: skip


def result(*rows):
    return {"schema": 1, "smoke": False, "rows": [CEILING, *rows]}


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


OLD = result(
    bw("softmax/scaled_softmax_fwd/bf16/sk=128/te_fast", 0.50),
    bw("softmax/scaled_softmax_bwd/bf16/sk=128/te_fast", 0.80),
    mod("module/causal/bf16/te_fast", 1.20),
    mod("small/causal/bf16/te_fast.reduce-overhead", 3.00),
)


def test_identical_runs_pass(tmp_path, capsys):
    assert main(["compare", write(tmp_path, "n.json", OLD), write(tmp_path, "o.json", OLD)]) == 0
    assert "verdict: ok" in capsys.readouterr().out


@pytest.mark.parametrize(
    "index, value, fails",
    [
        (1, 0.44, True),  # fraction of ceiling 0.50 -> 0.44: -12%
        (1, 0.46, False),  # -8%: noise
        (2, 0.70, True),  # bwd 0.80 -> 0.70: -12.5%
        (3, 1.00, True),  # module speedup 1.20 -> 1.00: -17%
        (4, 2.80, False),  # small speedup -6.7%
        (4, 6.00, False),  # an improvement never fails
    ],
)
def test_a_fall_over_ten_percent_fails(tmp_path, capsys, index, value, fails):
    new = json.loads(json.dumps(OLD))
    row = new["rows"][index]
    row["fraction_of_ceiling" if "fraction_of_ceiling" in row else "speedup"] = value
    code = main(["compare", write(tmp_path, "n.json", new), write(tmp_path, "o.json", OLD)])
    out = capsys.readouterr().out
    assert code == (1 if fails else 0), out
    assert ("FELL" in out) == fails
    if fails:
        assert row["case"] in out


def test_ok_to_wrong_is_broken():
    new = json.loads(json.dumps(OLD))
    new["rows"][1]["status"] = "WRONG"  # a fast wrong kernel: its ratio must not count
    new["rows"][1]["fraction_of_ceiling"] = 0.99
    c = compare(new, OLD)
    assert c.failed and c.broken == [
        ("softmax/scaled_softmax_fwd/bf16/sk=128/te_fast", "ok", "WRONG")
    ]


def test_missing_and_skipped_rows_are_listed_not_failed():
    new = result(OLD["rows"][1], {**OLD["rows"][2], "status": "skipped"})
    c = compare(new, OLD)
    assert not c.failed
    assert len(c.missing) == 3
    assert c.compared == 1


def test_new_rows_and_ceiling_are_not_compared():
    new = result(*OLD["rows"][1:], bw("softmax/x/bf16/sk=64/triton", 0.3))
    new["rows"][0] = {**CEILING, "fraction_of_ceiling": 0.5}
    c = compare(new, OLD)
    assert not c.failed and c.added == ["softmax/x/bf16/sk=64/triton"]


def test_an_old_problem_row_is_not_a_reference():
    old = result(bw("softmax/a/bf16/sk=64/te_fast", 0.9, status="WRONG"))
    new = result(bw("softmax/a/bf16/sk=64/te_fast", 0.3))
    assert not compare(new, old).failed


def test_unreadable_input_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    good = write(tmp_path, "o.json", OLD)
    assert main(["compare", str(bad), good]) == 2
    assert main(["compare", str(tmp_path / "absent.json"), good]) == 2
    assert main(["compare", write(tmp_path, "norows.json", {"x": 1}), good]) == 2
