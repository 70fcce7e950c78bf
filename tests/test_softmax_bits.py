"""tools/gpu/softmax_bits.py: the bitwise A/B of two te_fast builds. On the CPU (the quick matrix):
two runs of one build are bitwise equal, in digest files, tensor files and one of each; a
one-bit change in any output, a changed shape or a missing output is reported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

te_fast = pytest.importorskip("te_fast")
if te_fast.UNAVAILABLE_REASON is not None:
    pytest.skip(f"te_fast unavailable: {te_fast.UNAVAILABLE_REASON}", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "gpu"))
import softmax_bits  # noqa: E402

QUICK = ["--device", "cpu", "--quick"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """The quick matrix's outputs themselves (--tensors)."""
    path = tmp_path_factory.mktemp("bits") / "a.pt"
    assert softmax_bits.main(["save", str(path), *QUICK, "--tensors"]) == 0
    return path


@pytest.fixture(scope="module")
def digests(tmp_path_factory) -> Path:
    """The quick matrix's digests (the default)."""
    path = tmp_path_factory.mktemp("bits") / "a.json"
    assert softmax_bits.main(["save", str(path), *QUICK]) == 0
    return path


def test_same_build_is_bitwise_equal(saved, digests, tmp_path, capsys):
    again = tmp_path / "b.pt"
    assert softmax_bits.main(["save", str(again), *QUICK, "--tensors"]) == 0
    again_json = tmp_path / "b.json"
    assert softmax_bits.main(["save", str(again_json), *QUICK]) == 0
    for a, b in ((saved, again), (digests, again_json), (saved, again_json), (digests, again)):
        assert softmax_bits.main(["compare", str(a), str(b)]) == 0
        assert "0 differ" in capsys.readouterr().out


def test_digest_file_is_small_and_names_every_output(saved, digests):
    assert digests.stat().st_size < 64 << 10
    data = json.loads(digests.read_text())
    out = torch.load(saved)
    assert set(data["outputs"]) == set(out) and data["device"] == "cpu"
    name = sorted(out)[0]
    shape, dtype, sha = data["outputs"][name]
    assert shape == list(out[name].shape) and dtype == str(out[name].dtype)[len("torch.") :]
    assert len(sha) == 64


def test_matrix_covers_every_op_and_dtype(saved):
    names = set(torch.load(saved))
    for op in ("scaled_softmax", "scaled_masked_softmax", "scaled_upper_triang_masked_softmax",
               "scaled_aligned_causal_masked_softmax"):  # fmt: skip
        for dtype in ("fp16", "bf16", "fp32"):
            for suffix in ("", "_bwd"):
                assert any(n.startswith(f"{op}{suffix}-{dtype}-") for n in names), (op, dtype)
    assert any(n.endswith("-odd") for n in names)


def test_one_flipped_bit_is_found(saved, digests, tmp_path, capsys):
    out = torch.load(saved)
    name = "scaled_masked_softmax_bwd-fp32-sk100-scale0.125"
    flipped = out[name].clone()
    flipped.view(-1).view(torch.int32)[7] ^= 1  # one ulp of one element
    out[name] = flipped
    other = tmp_path / "flipped.pt"
    torch.save(out, other)
    assert softmax_bits.main(["compare", str(saved), str(other)]) == 1
    text = capsys.readouterr().out
    assert "1 differ" in text and name in text and "4 bytes differ" not in text
    assert "1 bytes differ" in text
    # against a digest file: found by its hash
    assert softmax_bits.main(["compare", str(digests), str(other)]) == 1
    text = capsys.readouterr().out
    assert "1 differ" in text and f"{name}: the bytes differ (SHA-256)" in text


def test_missing_or_reshaped_outputs_are_found(saved, digests, tmp_path, capsys):
    out = torch.load(saved)
    name = sorted(out)[0]
    reshaped = dict(out, **{name: out[name].reshape(-1)})
    torch.save(reshaped, tmp_path / "reshaped.pt")
    for base in (saved, digests):
        assert softmax_bits.main(["compare", str(base), str(tmp_path / "reshaped.pt")]) == 1
        assert name in capsys.readouterr().out
    del out[name]
    torch.save(out, tmp_path / "missing.pt")
    for base in (saved, digests):
        assert softmax_bits.main(["compare", str(base), str(tmp_path / "missing.pt")]) == 2
        assert "different outputs" in capsys.readouterr().out
