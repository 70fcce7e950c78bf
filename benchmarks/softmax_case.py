"""One softmax case's inputs, shared by te_fast's rows (ops_bench) and TE's (te_peer)."""

from __future__ import annotations

import torch

from benchmarks.cases import DTYPES, SoftmaxOp
from benchmarks.roofline import Traffic, softmax_traffic
from benchmarks.runner import Runner, base_row


def _shape(t: torch.Tensor) -> str:
    return "[" + ",".join(str(s) for s in t.shape) + "]"


class SoftmaxCase:
    """Inputs of one (dtype, sk) case, shared by every op and peer: [b, h, sq, sk] with
    sq = numel / (b*h*sk) (Plan.softmax_shape), or with square, [b, h, sk, sk] with
    b = numel / (h*sk*sk) (Plan.square_shape), where te_fast's and TE's causal ops run on the
    same tensors (TE's upper-triangular op requires sq == sk)."""

    def __init__(self, r: Runner, dtype: str, sk: int, square: bool = False):
        self.dtype, self.sk = dtype, sk
        shape = r.plan.square_shape(dtype, sk) if square else r.plan.softmax_shape(dtype, sk)
        b, h, sq, _ = shape
        self.b, self.h, self.sq = b, h, sq
        torch.manual_seed(sk * 7 + len(dtype))
        td = DTYPES[dtype]
        self.x = torch.randn(b, h, sq, sk, device=r.device, dtype=td)
        self.dy = torch.randn(b, h, sq, sk, device=r.device, dtype=td)
        self.misaligned = r.plan.misaligned
        if self.misaligned:
            self.x, self.dy = _one_element_in(self.x), _one_element_in(self.dy)
        self.config = "square" if square else "misaligned" if self.misaligned else None
        self.mask = torch.rand(b, 1, sq, sk, device=r.device) < 0.2  # True = masked out
        self.ys: dict[str, torch.Tensor] = {}
        self.shape = _shape(self.x)

    def x_for(self, op: SoftmaxOp) -> torch.Tensor:
        return self.x.view(self.b * self.h, self.sq, self.sk) if op.rank == 3 else self.x

    def as4(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.b, self.h, self.sq, self.sk)

    def traffic(self, masking: str, direction: str) -> Traffic:
        """What an op of this masking must move on this case's tensors (roofline.py)."""
        mask_bytes = self.mask.nbytes if masking == "mask" and direction == "fwd" else 0
        return softmax_traffic(
            masking, direction, tuple(self.x.shape), self.x.element_size(), mask_bytes
        )

    def row(self, op_name: str | None, impl: str) -> dict:
        layout = {"config": self.config} if self.config else {}
        return base_row(
            "softmax", impl, op=op_name, **layout, dtype=self.dtype, sk=self.sk, shape=self.shape
        )


def _one_element_in(t: torch.Tensor) -> torch.Tensor:
    """t's values in a contiguous tensor that starts one element past an aligned address."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out
