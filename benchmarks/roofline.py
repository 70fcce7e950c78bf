"""Honest rooflines: the bytes a softmax op must move, and the time the run's ceilings allow it.

Pure functions (no device, no timing), shared by the op rows (ops_bench, te_peer) and the
module's unfused roofline (module_bench). Sizes are in elements or bytes as named; ceilings are
GB/s of bytes read + written (1e9 bytes a second); times are milliseconds.

Masking (cases.SoftmaxOp.masking) and the kept prefix L(i) of row i of an [sq, sk] slice:
- "none": no mask, L(i) = sk;
- "mask": an explicit bool mask, data-dependent: the op reads all of x (and the mask), L(i) = sk;
- "upper_triang": top-left causal, row i keeps columns j <= i: L(i) = clamp(i + 1, 0, sk);
- "aligned_causal": bottom-right causal, row i keeps j <= i + sk - sq:
  L(i) = clamp(i + 1 + sk - sq, 0, sk) (rows i < sq - sk keep nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MASKINGS = ("none", "mask", "upper_triang", "aligned_causal")
DIRECTIONS = ("fwd", "bwd")
# The ceiling kernels (ops_bench.run_ceiling) by their (reads, writes) per element they move.
CEILING_MIX = {"copy": (1, 1), "add": (2, 1), "fill": (0, 1)}
TILE = 128  # the GEMM tile edge of the module's tile-skipping bound


def _causal_offset(masking: str, sq: int, sk: int) -> int | None:
    """Row i keeps columns j <= i + offset; None for the full-row maskings."""
    if masking not in MASKINGS:
        raise ValueError(f"unknown masking {masking!r}, not in {MASKINGS}")
    if masking == "upper_triang":
        return 0
    if masking == "aligned_causal":
        return sk - sq
    return None


def kept_prefix(masking: str, i: int, sq: int, sk: int) -> int:
    """L(i): the columns row i of an [sq, sk] slice keeps (a prefix of the row)."""
    offset = _causal_offset(masking, sq, sk)
    return sk if offset is None else min(max(i + 1 + offset, 0), sk)


def kept_elements(masking: str, sq: int, sk: int) -> int:
    """K = sum over the sq rows of L(i): the kept elements of one [sq, sk] slice (closed form).

    L(i) = clamp(v, 0, sk) with v = i + 1 + offset running over [1 + offset, sq + offset]: the
    values in [1, sk] add up as an arithmetic series, those above sk count sk each."""
    offset = _causal_offset(masking, sq, sk)
    if offset is None:
        return sq * sk
    lo, hi = 1 + offset, sq + offset
    first, last = max(lo, 1), min(hi, sk)
    ramp = (first + last) * (last - first + 1) // 2 if last >= first else 0
    flat = sk * max(0, hi - max(lo, sk + 1) + 1)
    return ramp + flat


def kept_tile_fraction(masking: str, sq: int, sk: int, tile: int = TILE) -> float:
    """The fraction of the tile x tile blocks of an [sq, sk] slice that hold a kept element
    (edge blocks count whole): the share of a GEMM's flops a tile-skipping kernel must do.
    The kept prefix grows with the row, so block row I keeps ceil(L(last row of I) / tile)
    blocks. Full-row maskings keep every block ("mask" too: its mask is data)."""
    rows, cols = math.ceil(sq / tile), math.ceil(sk / tile)
    if _causal_offset(masking, sq, sk) is None:
        return 1.0
    kept = sum(
        math.ceil(kept_prefix(masking, min(sq, (r + 1) * tile) - 1, sq, sk) / tile)
        for r in range(rows)
    )
    return kept / (rows * cols)


@dataclass(frozen=True)
class Traffic:
    """Bytes one call moves: what it must read and write, and the old full-row count."""

    read_bytes: int
    write_bytes: int
    full_row_bytes: int  # every element of every row read and written (+ the mask once)

    @property
    def must_move_bytes(self) -> int:
        return self.read_bytes + self.write_bytes


def softmax_traffic(
    masking: str, direction: str, shape: tuple[int, ...], elem: int, mask_bytes: int = 0
) -> Traffic:
    """The bytes a softmax op must move on a tensor of `shape` (..., sq, sk) of `elem`-byte
    elements: R = prod(shape[:-2]) slices of K = kept_elements(masking, sq, sk) kept elements.
    - forward: read the kept x, R*K*elem (+ mask_bytes: the explicitly masked op reads all of x
      and its mask), write all of y, R*sq*sk*elem (masked elements are written as 0);
    - backward: read the kept dy and y, 2*R*K*elem, write all of dx, R*sq*sk*elem.
    full_row_bytes is the count before these rules: 2 (forward, + mask_bytes) or 3 (backward)
    times the tensor's bytes."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}, not in {DIRECTIONS}")
    *batch, sq, sk = shape
    slices = math.prod(batch)
    kept = slices * kept_elements(masking, sq, sk) * elem
    full = slices * sq * sk * elem
    if direction == "fwd":
        return Traffic(kept + mask_bytes, full, 2 * full + mask_bytes)
    return Traffic(2 * kept, full, 3 * full)


def ms_at(nbytes: int, gbps: float) -> float:
    """Milliseconds to move nbytes at gbps (1e9 bytes a second)."""
    return nbytes / (gbps * 1e9) * 1e3


def roofline_ms(read_bytes: int, write_bytes: int, ceilings: dict[str, float]) -> tuple[float, str]:
    """(ms, which ceilings): the time the run's ceiling kernels take to read read_bytes and
    write write_bytes, by the kernels whose read:write mix is nearest (CEILING_MIX).

    ceilings: GB/s (bytes read + written a second) of "copy" (1 read : 1 write), "add"
    (2 : 1, torch.add(a, b, out=c)) and "fill" (0 : 1). With R read and W written bytes, the
    traffic is split into the two kernels whose mixes bracket R:W, so that together they read R
    and write W, each share at its own ceiling:
    - W <= R <= 2W: an add of R - W written bytes (3(R - W) moved) + a copy of 2W - R
      (2(2W - R) moved); a forward of full rows (R = W) is a copy, a backward (R = 2W) an add;
    - R < W (causal rows whose masked part is written, not read): a copy of the R read bytes
      (2R moved) + a fill of the other W - R written bytes;
    - R > 2W (no softmax op reads that much): all R + W bytes at the add ceiling.
    The split is continuous in R:W and exact at the three measured mixes."""
    r, w = read_bytes, write_bytes
    if r > 2 * w:
        shares = {"add": r + w}
    elif r >= w:
        shares = {"add": 3 * (r - w), "copy": 2 * (2 * w - r)}
    else:
        shares = {"copy": 2 * r, "fill": w - r}
    used = {k: n for k, n in shares.items() if n > 0}
    ms = sum(ms_at(n, ceilings[k]) for k, n in used.items())
    return ms, "+".join(k for k in CEILING_MIX if k in used)
