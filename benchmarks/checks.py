"""Sanity checks run before timing: a fast wrong result must be marked WRONG, never look good."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Bounds on max|out - ref| / max|ref|. Loose (many ulps of the dtype) so a correct kernel never
# trips them; a wrong kernel (garbage, unnormalised rows, a wrong mask) misses by orders of
# magnitude. Normalising by max|ref| keeps the check meaningful for 64K-column rows whose
# probabilities are ~1e-5 each.
OP_BOUND = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
# Attention output and gradients go through two GEMMs and low-precision probabilities.
MODULE_BOUND = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}


@dataclass(frozen=True)
class Check:
    """Result of comparing an output with its reference: ok, the worst error and the bound."""

    ok: bool
    error: float
    bound: float
    where: str = ""

    def describe(self) -> str:
        where = f" {self.where}" if self.where else ""
        return f"rel err {self.error:.2e} (bound {self.bound:.0e}){where}"


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref| in fp32; inf on a shape mismatch or any non-finite output."""
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    out32, ref32 = out.detach().float(), ref.detach().float()
    if not bool(torch.isfinite(out32).all()):
        return math.inf
    scale = max(float(ref32.abs().max()), 1e-30) if ref32.numel() else 1.0
    return float((out32 - ref32).abs().max()) / scale if ref32.numel() else 0.0


def combine(checks: dict[str, Check]) -> Check:
    """The worst of several named checks (output and each gradient)."""
    name, worst = max(checks.items(), key=lambda kv: kv[1].error / kv[1].bound)
    ok = all(c.ok for c in checks.values())
    return Check(ok, worst.error, worst.bound, where=f"worst: {name}")


def check(out: torch.Tensor, ref: torch.Tensor, bound: float) -> Check:
    err = relative_error(out, ref)
    return Check(err <= bound, err, bound)


# ----------------------------------------------------------------------------- softmax references


def causal_masked(kind: str, rows: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """Bool (len(rows), sk), True = masked out, for row indices `rows` of an [sq, sk] block.

    kind: "upper_triang" keeps j <= i (top-left); "aligned_causal" keeps j <= i + sk - sq.
    """
    j = torch.arange(sk, device=rows.device).view(1, sk)
    i = rows.view(-1, 1)
    if kind == "upper_triang":
        return j > i
    if kind == "aligned_causal":
        return j > i + (sk - sq)
    raise ValueError(f"unknown causal kind {kind!r}")


def softmax_ref(x: torch.Tensor, scale: float, masked: torch.Tensor | None) -> torch.Tensor:
    """softmax(scale * x) over the last dim in fp32; masked -> 0; a fully masked row -> 0."""
    logits = x.float() * scale
    if masked is not None:
        logits = logits.masked_fill(masked, float("-inf"))
    return torch.softmax(logits, -1).nan_to_num(0.0)


def softmax_bwd_ref(dy: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    """dx = scale * y * (dy - sum_j dy_j y_j) in fp32."""
    dy32, y32 = dy.float(), y.float()
    return scale * y32 * (dy32 - (dy32 * y32).sum(-1, keepdim=True))


def sample_blocks(b: int, h: int, sq: int, sk: int) -> list[tuple[int, int, torch.Tensor]]:
    """A few (batch, head, row indices) blocks to check: the first rows of the first head and the
    last rows of the last head (causal masks differ most there), ~64K elements each."""
    r = max(1, min(sq, (1 << 16) // sk))
    return [
        (0, 0, torch.arange(0, r)),
        (b - 1, h - 1, torch.arange(sq - r, sq)),
    ]


# ----------------------------------------------------------------------------- softmax op outputs


def _masked_rows(masking: str, mask, bi: int, rows, sq: int, sk: int):
    if masking == "mask":
        return mask[bi, 0, rows]
    if masking in ("upper_triang", "aligned_causal"):
        return causal_masked(masking, rows, sq, sk)
    return None


def check_fwd(y4, x, mask, masking: str, scale: float) -> Check:
    """y4 (b, h, sq, sk) against softmax_ref on sample rows, then the whole tensor: every row
    sums to 1, or to 0 where it is fully masked (so NaN, zeroed or unnormalised rows show)."""
    b, h, sq, sk = x.shape
    bound = OP_BOUND[x.dtype]
    err = 0.0
    for bi, hi, rows in sample_blocks(b, h, sq, sk):
        rows = rows.to(x.device)
        ref = softmax_ref(x[bi, hi, rows], scale, _masked_rows(masking, mask, bi, rows, sq, sk))
        err = max(err, relative_error(y4[bi, hi, rows], ref))
    sums = y4.sum(-1, dtype=torch.float32)  # (b, h, sq)
    rows_ok = (sums - _expected_sums(masking, mask, sq, sk, x.device)).abs() <= bound
    if not bool(rows_ok.all()):  # also catches NaN/inf anywhere
        bad = int((~rows_ok).sum())
        return Check(False, float("inf"), bound, where=f"{bad} row sum(s) wrong")
    return Check(err <= bound, err, bound)


def _expected_sums(masking: str, mask, sq: int, sk: int, device) -> torch.Tensor:
    """Every row of a softmax sums to 1, except fully masked rows (0); broadcasts to (b, h, sq)."""
    if masking == "mask":
        return (~mask.all(-1)).float()  # (b, 1, sq)
    if masking == "aligned_causal":  # rows i < sq - sk keep no column
        return (torch.arange(sq, device=device) >= sq - sk).float()  # (sq,)
    return torch.ones((), device=device)  # none; upper_triang keeps column 0 in every row


def check_bwd(dx4, dy4, y4, scale: float) -> Check:
    b, h, sq, sk = y4.shape
    bound = OP_BOUND[y4.dtype]
    err = 0.0
    for bi, hi, rows in sample_blocks(b, h, sq, sk):
        rows = rows.to(y4.device)
        ref = softmax_bwd_ref(dy4[bi, hi, rows], y4[bi, hi, rows], scale)
        err = max(err, relative_error(dx4[bi, hi, rows], ref))
    if not bool(torch.isfinite(dx4).all()):
        return Check(False, float("inf"), bound, where="non-finite values")
    return Check(err <= bound, err, bound)
