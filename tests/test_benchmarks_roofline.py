"""benchmarks/roofline.py: the kept elements and tiles of the causal masks against brute-force
counts, the must-move bytes of each op, and the ceiling rule of roofline_ms, by hand."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks.roofline import (
    kept_elements,
    kept_prefix,
    kept_tile_fraction,
    roofline_ms,
    softmax_traffic,
)

# every (sq, sk) of 1..9 (sq > sk, sq < sk, sq = sk, sk = 1, sq = 1), and some longer ones
SHAPES = list(itertools.product(range(1, 10), range(1, 10))) + [
    (1, 1000), (1000, 1), (37, 129), (129, 37), (128, 128), (2048, 2048), (300, 4096),
    (4096, 300), (8193, 64), (64, 8193),
]  # fmt: skip


def kept_mask(masking: str, sq: int, sk: int) -> torch.Tensor:
    """Brute force: (sq, sk), 1 where row i keeps column j."""
    ones = torch.ones(sq, sk, dtype=torch.int64)
    if masking == "upper_triang":
        return ones.tril(diagonal=0)  # top-left: j <= i
    if masking == "aligned_causal":
        return ones.tril(diagonal=sk - sq)  # bottom-right: j <= i + sk - sq
    return ones  # none, mask: whole rows


@pytest.mark.parametrize("masking", ["none", "mask", "upper_triang", "aligned_causal"])
def test_kept_elements_and_prefixes_against_tril(masking):
    for sq, sk in SHAPES:
        mask = kept_mask(masking, sq, sk)
        assert kept_elements(masking, sq, sk) == int(mask.sum()), (sq, sk)
        rows = mask.sum(1).tolist()
        assert [kept_prefix(masking, i, sq, sk) for i in range(sq)] == rows, (sq, sk)


def test_kept_elements_by_hand():
    assert kept_elements("upper_triang", 4, 4) == 1 + 2 + 3 + 4
    assert kept_elements("aligned_causal", 4, 4) == 10  # square: both corners alike
    assert kept_elements("upper_triang", 6, 3) == 1 + 2 + 3 * 4  # rows past sk keep all
    assert kept_elements("aligned_causal", 6, 3) == 0 + 0 + 0 + 1 + 2 + 3  # rows i < 3 keep none
    assert kept_elements("upper_triang", 2, 5) == 1 + 2
    assert kept_elements("aligned_causal", 2, 5) == 4 + 5
    with pytest.raises(ValueError):
        kept_elements("causal", 4, 4)


@pytest.mark.parametrize("masking", ["none", "upper_triang", "aligned_causal"])
@pytest.mark.parametrize("tile", [1, 3, 4, 128])
def test_kept_tile_fraction_against_tril(masking, tile):
    """The share of tile x tile blocks (edge blocks whole) holding a kept element."""
    for sq, sk in SHAPES:
        if sq * sk > 1 << 20:
            continue
        mask = kept_mask(masking, sq, sk)
        rows, cols = -(-sq // tile), -(-sk // tile)
        padded = torch.zeros(rows * tile, cols * tile, dtype=torch.int64)
        padded[:sq, :sk] = mask
        blocks = padded.view(rows, tile, cols, tile).sum((1, 3)) > 0
        want = float(blocks.float().mean())
        assert kept_tile_fraction(masking, sq, sk, tile) == pytest.approx(want), (sq, sk)


def test_kept_tile_fraction_of_the_module_shape():
    """Causal s = 2048 in 128x128 tiles: n = 16 tile rows, n(n + 1)/2 of n^2 tiles kept."""
    assert kept_tile_fraction("upper_triang", 2048, 2048) == pytest.approx(136 / 256)
    assert kept_tile_fraction("mask", 2048, 2048) == 1.0  # a mask is data: every tile counts


@pytest.mark.parametrize("masking", ["none", "mask", "upper_triang", "aligned_causal"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (6, 7, 5), (4, 2, 9, 3), (1, 1, 1, 1)])
def test_softmax_traffic_against_a_brute_force_count(masking, shape):
    """Forward: the kept x read (+ the mask for the masked op), all of y written; backward: the
    kept dy and y read, all of dx written; full_row_bytes: the count before (2x or 3x the
    tensor's bytes, + the mask once)."""
    elem, mask_bytes = 2, 11 if masking == "mask" else 0
    x = torch.empty(shape, dtype=torch.bfloat16)
    slices = x.numel() // (shape[-2] * shape[-1])
    kept = slices * int(kept_mask(masking, shape[-2], shape[-1]).sum())
    fwd = softmax_traffic(masking, "fwd", shape, elem, mask_bytes)
    assert fwd.read_bytes == kept * elem + mask_bytes
    assert fwd.write_bytes == x.nbytes
    assert fwd.full_row_bytes == 2 * x.nbytes + mask_bytes
    assert fwd.must_move_bytes == fwd.read_bytes + fwd.write_bytes
    bwd = softmax_traffic(masking, "bwd", shape, elem)
    assert (bwd.read_bytes, bwd.write_bytes) == (2 * kept * elem, x.nbytes)
    assert bwd.full_row_bytes == 3 * x.nbytes
    if masking in ("none", "mask"):  # whole rows: the figures of before
        assert fwd.must_move_bytes == fwd.full_row_bytes
        assert bwd.must_move_bytes == bwd.full_row_bytes


def test_softmax_traffic_of_a_square_causal_forward():
    """[64, 4096, 4096] bf16, top-left causal: 4096*4097/2 kept a slice."""
    t = softmax_traffic("upper_triang", "fwd", (64, 4096, 4096), 2)
    assert t.read_bytes == 64 * (4096 * 4097 // 2) * 2
    assert t.write_bytes == 64 * 4096 * 4096 * 2
    with pytest.raises(ValueError):
        softmax_traffic("none", "both", (1, 2, 2), 2)


# ceilings of 1, 2 and 4 bytes a millisecond (1e-6 GB/s = 1000 bytes a second)
CEILINGS = {"copy": 1e-6, "add": 2e-6, "fill": 4e-6}


@pytest.mark.parametrize(
    "read, write, ms, used",
    [
        (100, 100, 200.0, "copy"),  # 1:1, a copy of 200 bytes
        (200, 100, 150.0, "add"),  # 2:1, an add of 300 bytes
        (0, 100, 25.0, "fill"),  # 0:1, a fill of 100 bytes
        (150, 100, 75.0 + 100.0, "copy+add"),  # add of 50 written (150 moved) + copy of 50 (100)
        (40, 100, 80.0 + 15.0, "copy+fill"),  # copy of the 40 read (80 moved) + fill of 60
        (300, 100, 200.0, "add"),  # more than 2:1: all 400 bytes at the add ceiling
    ],
)
def test_roofline_ms_by_hand(read, write, ms, used):
    assert roofline_ms(read, write, CEILINGS) == (pytest.approx(ms), used)


def test_roofline_ms_is_continuous_across_the_mixes():
    for read in (99, 100, 101, 199, 200, 201):
        below = roofline_ms(read - 1e-9, 100, CEILINGS)[0]
        assert roofline_ms(read, 100, CEILINGS)[0] == pytest.approx(below, rel=1e-6)
    # equal ceilings: the time of moving read + write bytes at that rate, whatever the mix
    same = {"copy": 1e-6, "add": 1e-6, "fill": 1e-6}
    for read in (0, 30, 100, 170, 200, 250):
        assert roofline_ms(read, 100, same)[0] == pytest.approx(read + 100.0)
