"""tools/kernel_resources.py: ptxas's per-kernel report parsed, and the spill gate of CI (.ci/run
runs it with the real nvcc). Here nvcc is a stand-in that prints a canned ptxas report, so the
gate's decisions are checked without compiling: a new or grown spill fails and is named, a
smaller or vanished one is a note, no kernels at all or an unreadable table is an error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import kernel_resources as kr  # noqa: E402

A = "_ZN15te_fast_kernels14softmax_detail16softmax_fwd_rowsI6__halfLi8ELi4ELi512ELi1ELb1ELi1024EEEvNS_14SoftmaxFwdArgsE"  # noqa: E501
B = "_ZN15te_fast_kernels14softmax_detail16softmax_fwd_longIfLi8ELi512ELi1ELb0EEEvNS_14SoftmaxFwdArgsE"  # noqa: E501


def report(a_spill: int = 16, b_spill: int = 0) -> str:
    """A ptxas -v report of two entry functions, with a device function's properties between."""
    return f"""ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '{A}' for 'sm_90'
ptxas info    : Function properties for {A}
    {a_spill} bytes stack frame, {a_spill} bytes spill stores, {a_spill // 2} bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 144 bytes smem
ptxas info    : Compile time = 31.144 ms
ptxas info    : Function properties for __internal_accurate_pow
    40 bytes stack frame, 40 bytes spill stores, 40 bytes spill loads
ptxas info    : Compiling entry function '{B}' for 'sm_90'
ptxas info    : Function properties for {B}
    {b_spill} bytes stack frame, {b_spill} bytes spill stores, {b_spill} bytes spill loads
ptxas info    : Used 38 registers, used 1 barriers, 224 bytes smem
"""


def test_parse_entries_only():
    got = kr.parse_ptxas(report())
    assert got == {
        A: {"registers": 64, "spill_stores": 16, "spill_loads": 8},
        B: {"registers": 38, "spill_stores": 0, "spill_loads": 0},
    }
    assert kr.spills(got) == {A: [16, 8]}


def test_check_decisions():
    assert kr.check({A: [16, 8]}, {A: [16, 8]}) == ([], [])
    failures, _ = kr.check({A: [16, 8], B: [4, 4]}, {A: [16, 8]})
    assert [n for n, _ in failures] == [B]  # a new spill
    failures, _ = kr.check({A: [16, 12]}, {A: [16, 8]})
    assert [n for n, _ in failures] == [A] and "16/12" in failures[0][1]  # grown loads
    failures, notes = kr.check({A: [8, 8]}, {A: [16, 8], B: [4, 4]})
    assert failures == [] and {n for n, _ in notes} == {A, B}  # smaller; gone


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    """An nvcc that prints report(A_SPILL, B_SPILL) as ptxas would (on stderr) and writes -o."""
    script = tmp_path / "nvcc"

    def use(a_spill: int, b_spill: int = 0, text: str | None = None) -> str:
        body = report(a_spill, b_spill) if text is None else text
        (tmp_path / "report.txt").write_text(body)
        script.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"sys.stderr.write(open({str(tmp_path / 'report.txt')!r}).read())\n"
            "open(sys.argv[sys.argv.index('-o') + 1], 'w').close()\n"
        )
        script.chmod(0o755)
        return str(script)

    return use


def run(capsys, *args) -> tuple[int, str]:
    code = kr.main([*args, "--jobs", "2"])
    return code, capsys.readouterr().out


def test_gate_end_to_end(fake_nvcc, tmp_path, capsys):
    table = str(tmp_path / "spills.json")
    nvcc = fake_nvcc(16)
    code, out = run(capsys, "--nvcc", nvcc, "--table", table, "--update")
    assert code == 0 and "wrote 1 accepted spills" in out
    assert list(json.loads(Path(table).read_text())["spills"]) == [A]
    code, out = run(capsys, "--nvcc", nvcc, "--table", table, "--check")
    assert code == 0 and "every spill within" in out

    code, out = run(capsys, "--nvcc", fake_nvcc(32), "--table", table, "--check")  # A grew
    assert code == 1 and "SPILL:" in out and "32/16 bytes, 16/8 accepted" in out
    code, out = run(capsys, "--nvcc", fake_nvcc(16, 4), "--table", table, "--check")  # B is new
    assert code == 1 and "not accepted" in out
    code, out = run(capsys, "--nvcc", fake_nvcc(0), "--table", table, "--check")  # A is gone
    assert code == 0 and "note:" in out and "no longer spills" in out


def test_nothing_to_check_is_an_error(fake_nvcc, tmp_path, capsys):
    code, _ = run(capsys, "--nvcc", fake_nvcc(0, text="ptxas info : 0 bytes gmem\n"), "--check")
    assert code == 2
    missing = str(tmp_path / "none.json")
    code, _ = run(capsys, "--nvcc", fake_nvcc(16), "--table", missing, "--check")
    assert code == 2
    assert kr.main(["--nvcc", str(tmp_path / "no-such-nvcc"), "--check"]) == 2


def test_the_accepted_table_names_real_kernels():
    """The checked-in table is readable, and every entry is a te_fast kernel with its name."""
    table = json.loads(kr.TABLE.read_text())["spills"]
    assert table
    for mangled, (stores, loads, name) in table.items():
        assert mangled.startswith("_ZN15te_fast_kernels") and "softmax" in name
        assert stores > 0 or loads > 0
