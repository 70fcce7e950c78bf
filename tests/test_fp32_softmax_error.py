"""tools/fp32_softmax_error.py, the fp32 error breakdown the README quotes, on two seeds (CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "fp32_softmax_error.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("fp32_softmax_error", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_column_is_a_ratio_inside_the_rule(tool, capsys):
    table = tool.main("cpu", seeds=2, lengths=(13, 100))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["cpu sk13", "cpu sk100"]
    for ratios in table.values():
        assert set(ratios) == {"y", "dx_kernel", "dx_float", "dx_double", "dx_exact_y"}
        for name, values in ratios.items():
            assert len(values) == 2 and all(0 <= r < 1 for r in values), (name, values)
