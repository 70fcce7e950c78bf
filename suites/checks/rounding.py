"""Random rounding: the same-precision composite's error as a distribution, not one draw (SPEC §6).

SPEC §6 bounds an implementation by k times the error of the same-precision naive composite. That
composite rounds once per operation, to nearest, and its error is one sample of what such
roundings do: where it happens to round well, or where values cancel, k times it bounds nothing
a correct implementation may do. ``RandomRounding`` runs te_ref's float64 computation with the
result of every operation that rounds in the composite (a GEMM, a sum, an elementwise sum,
difference, product or quotient, a softmax and its backward) rounded at random: each element the
case's dtype does not hold exactly moves by a uniform draw within half an ulp of the dtype at its
value (what a rounding to nearest does, with the position in the ulp drawn); a value the dtype
holds (0, inf, a product by 2) stays, as it does in the composite. Operations that move or
select values (views, copies, masks, maxima, concatenation) are exact in every precision and are
left alone. Each run is a composite whose roundings are drawn afresh, so the largest error over
a few of them measures what the composite's roundings can do on these inputs, cancellation
included: the float64 values that cancel are each rounded before they do.

Not modelled: the rounding inside a GEMM's or a sum's accumulation (fp32's in every
implementation, far below bf16's and fp16's; in fp32 cases the composite's own error carries it),
and formulations other than the composite's (a FlashAttention-form backward's row term
rowsum(out * dO), where the composite has rowsum(P * dP)).

An operation in neither list is an error (``UnclassifiedOp``): a te_ref change that brings a new
operation must say whether it rounds (suites/judge/test_rounding.py runs the case matrices).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten operations (overload packets) that round their result in a same-precision composite
ROUNDS = frozenset({
    "add", "sub", "mul", "div", "bmm", "mm", "addmm", "baddbmm", "matmul", "sum", "mean",
    "exp", "log", "sqrt", "rsqrt", "reciprocal", "pow", "tanh", "sigmoid",
    "_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data",
    "logsumexp",
})  # fmt: skip
# aten operations whose float results are values of their inputs (or constants): exact in every
# precision
EXACT = frozenset({
    "_to_copy", "_unsafe_view", "abs", "neg", "amax", "amin", "max", "min", "as_strided", "cat",
    "clone", "copy_", "detach", "empty", "empty_like", "expand", "lift_fresh", "masked_fill",
    "new_empty_strided", "new_zeros", "new_ones", "new_full", "ones", "ones_like", "permute",
    "select", "select_backward", "slice", "slice_backward", "squeeze", "unsqueeze", "tril", "triu",
    "view", "zeros", "zeros_like", "full", "full_like", "transpose", "t", "where", "index",
    "index_select", "gather", "stack", "contiguous", "alias", "fill_", "zero_", "split",
    "split_with_sizes", "unbind", "narrow", "flip", "repeat", "index_put", "index_put_",
    "scatter", "_unsafe_index", "unfold", "constant_pad_nd", "masked_fill_", "clamp", "relu",
    "arange", "sign",
})  # fmt: skip


# operations that add up products or terms (their first argument's): accumulated in fp32
ACCUMULATES = frozenset({"bmm", "mm", "matmul", "sum"})
ACCUMULATION_DTYPE = torch.float32


class UnclassifiedOp(RuntimeError):
    """te_ref ran a float64 operation that is in neither ROUNDS nor EXACT."""


class RandomRounding(TorchDispatchMode):
    """While active, every float64 result of an operation in ROUNDS is rounded at random for
    ``dtype``: each element the dtype does not hold moves by a uniform draw within half an ulp of
    the dtype at its value. ``seed`` makes a run reproducible (one generator per device, seeded
    alike)."""

    def __init__(self, dtype: torch.dtype, seed: int):
        super().__init__()
        self.dtype = dtype
        self.seed = seed
        self.generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self.generators:
            self.generators[device] = torch.Generator(device).manual_seed(self.seed)
        return self.generators[device]

    def _step(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A uniform draw within half an ulp of ``dtype`` at each element of ``t`` (0 where t is
        inf or NaN)."""
        info = torch.finfo(dtype)
        delta = torch.rand(t.shape, dtype=t.dtype, device=t.device,
                           generator=self._generator(t.device))  # fmt: skip
        _, exponent = torch.frexp(t.abs().clamp(min=info.tiny))  # |t| = m * 2**e, 0.5 <= m < 1
        spacing = torch.ldexp(torch.full_like(t, info.eps / 2), exponent)  # eps * 2**(e - 1)
        return delta.sub_(0.5).mul_(spacing).masked_fill_(~torch.isfinite(t), 0.0)

    def _round(self, t: torch.Tensor) -> None:
        """t += uniform [-1/2, 1/2] ulp of the case's dtype at each element that the dtype does
        not hold exactly (a value it holds, 0, inf and NaN among them, rounds to itself)."""
        step = self._step(t, self.dtype)
        t.add_(step.masked_fill_(t.to(self.dtype).to(t.dtype) == t, 0.0))

    def _accumulating(self, name: str, args: tuple) -> tuple:
        """The arguments of a GEMM or a sum with the operand whose products or terms it adds up
        rounded once more for fp32, the accumulation precision of every implementation: the
        first-order error of an fp32 accumulation, each product or term rounded (negligible
        beside bf16's and fp16's roundings; in fp32 cases of the size of the result's own)."""
        if name not in ACCUMULATES or not isinstance(args[0], torch.Tensor):
            return args
        if args[0].dtype != torch.float64:
            return args
        return (args[0] + self._step(args[0], ACCUMULATION_DTYPE), *args[1:])

    def _softmax_backward(self, grad: torch.Tensor, y: torch.Tensor, dim: int, *_) -> torch.Tensor:
        """dx = y * (dy - rowsum(y * dy)), the row term's terms each rounded for the dtype before
        they are summed, and dx rounded: where dy - rowsum cancels (a row with one key, or one
        dominant key), what is left is the rounding of terms of the row term's size, as an
        implementation that takes the row term from values held in the case's dtype (a
        FlashAttention-form backward: rowsum(out * dO)) leaves it."""
        terms = y * grad
        self._round(terms)
        dx = y * (grad - terms.sum(dim, keepdim=True))
        self._round(dx)
        return dx

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "_softmax_backward_data" and args[0].dtype == torch.float64:
            return self._softmax_backward(*args)
        out = func(*self._accumulating(name, args), **(kwargs or {}))
        results = [r for r in (out if isinstance(out, (tuple, list)) else (out,))
                   if isinstance(r, torch.Tensor) and r.dtype == torch.float64]  # fmt: skip
        if not results:
            return out
        if name in ROUNDS:
            for r in results:
                self._round(r)
        elif name not in EXACT:
            raise UnclassifiedOp(
                f"te_ref ran aten.{name} on float64 values: say in suites/checks/rounding.py "
                "whether it rounds (ROUNDS) or is exact (EXACT)"
            )
        return out
