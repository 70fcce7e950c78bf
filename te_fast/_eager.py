"""Eager-mode autograd for the te_fast softmax ops, without the registered kernel's Python hop.

The autograd that ``torch.library.register_autograd`` puts on an op is a Python kernel at the
Autograd dispatch key: every call goes C++ -> Python (argument boxing, ``fill_defaults``, a
generated ``autograd.Function``) -> C++, and so does every backward op call, even with grad off.
At small shapes that host time is larger than the kernels. Here the forward and backward ops are
called below autograd and one lean ``autograd.Function`` records the same formula (``dx =
<op>_bwd(dy, y, scale)``) - same kernels, same results.

Only for plain eager calls: under ``torch.compile``/``torch.export`` (and functorch transforms)
``softmax`` calls the op itself, so a trace sees the op and its registered autograd exactly as
before.
"""

from __future__ import annotations

import torch

from te_fast import _registry as reg
from te_fast._loader import UNAVAILABLE_REASON

_below_autograd = torch._C._AutoDispatchBelowAutograd
_is_compiling = torch.compiler.is_compiling
_functorch_active = torch._C._are_functorch_transforms_active


def _op(name: str):
    return getattr(torch.ops.te_fast, name).default


def _run(fwd, x, mask, scale, rows):
    """fwd(x[, mask], scale), on x.reshape(rows) and viewed back to x's shape when rows is given."""
    xr = x if rows is None else x.reshape(rows)
    y = fwd(xr, scale) if mask is None else fwd(xr, mask, scale)
    return y if rows is None else y.view(x.shape)


class _Softmax(torch.autograd.Function):
    """y = fwd(x[, mask], scale) below autograd; dx = bwd(dy, y, scale).

    rows: the shape the op takes when it differs from x's ([b * h, sq, sk] for a 3-D op on
    [b, h, sq, sk] scores): x is viewed to it and y back, inside the one autograd node.
    """

    @staticmethod
    def forward(ctx, x, mask, scale, fwd, bwd, rows):
        with _below_autograd():
            y = _run(fwd, x, mask, scale, rows)
        ctx.scale, ctx.bwd, ctx.rows = scale, bwd, rows
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        rows, shape = ctx.rows, y.shape
        if rows is not None:
            dy, y = dy.reshape(rows), y.view(rows)
        if torch.is_grad_enabled():  # create_graph: through the op's registered double backward
            dx = ctx.bwd(dy, y, ctx.scale)
        else:
            with _below_autograd():
                dx = ctx.bwd(dy, y, ctx.scale)
        if rows is not None:
            dx = dx.view(shape)
        return dx, None, None, None, None, None


_PAIRS = (
    {}
    if UNAVAILABLE_REASON is not None
    else {s.name: (_op(s.name), _op(s.backward)) for s in reg.OPS if s.kind == reg.SOFTMAX_FWD}
)


def softmax(
    name: str, x: torch.Tensor, mask: torch.Tensor | None, scale: float, rows: tuple | None = None
) -> torch.Tensor:
    """The te_fast softmax forward op ``name`` (e.g. "scaled_softmax_fwd") on x [, mask].

    rows: run the op on x.view(rows) (x contiguous) and view the result back to x's shape.
    """
    if UNAVAILABLE_REASON is not None:
        raise RuntimeError(UNAVAILABLE_REASON)
    fwd, bwd = _PAIRS[name]
    if _is_compiling() or _functorch_active():
        return _run(fwd, x, mask, scale, rows)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Softmax.apply(x, mask, scale, fwd, bwd, rows)
    with _below_autograd():  # nothing to record: what the registered kernel would redispatch to
        return _run(fwd, x, mask, scale, rows)
