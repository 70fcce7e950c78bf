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


def plain_eager() -> bool:
    """Whether this is a plain eager call: traces (torch.compile, export, functorch transforms)
    see the ops themselves, whole tensors and their registered autograd."""
    return not (_is_compiling() or _functorch_active())


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
    if not plain_eager():
        return _run(fwd, x, mask, scale, rows)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Softmax.apply(x, mask, scale, fwd, bwd, rows)
    with _below_autograd():  # nothing to record: what the registered kernel would redispatch to
        return _run(fwd, x, mask, scale, rows)


# ----------------------------------------------------------------------------- chunked core
# Eager training at long sequence lengths is bound by memory, not time: an unfused attention
# holds the probabilities P for the backward (one [b, h, sq, skv] tensor), and whole-tensor
# steps add the scores next to P in the forward and dP and dS next to P in the backward, three
# such tensors at once. The chunked core runs BMM1 -> softmax -> BMM2 and its backward slice by
# slice along the batch (or head) axis, so that besides P only one slice's scores, or one
# slice's dP and dS, are alive. Every row is computed by the same kernels as without chunks
# (te_fast's softmax rows are batch-invariant), in the same order per slice.


def chunk_bounds(b: int, h: int, sq: int, skv: int, itemsize: int, limit: int):
    """(axis, [(lo, hi), ...]) splitting the scores [b, h, sq, skv] into slices of at most
    ``limit`` bytes along the batch axis (0), or the head axis (1) when there are fewer batch
    elements than slices; None when one piece fits."""
    total = b * h * sq * skv * itemsize
    n = -(-total // max(limit, 1))
    if n <= 1:
        return None
    axis, size = (0, b) if b >= n else (1, h)
    n = min(n, size)
    if n <= 1:
        return None
    edges = [size * i // n for i in range(n + 1)]
    return axis, list(zip(edges[:-1], edges[1:]))


def _take(t, axis, lo, hi):
    """t[lo:hi] along axis (0 or 1) when t has that axis in full, else t (broadcast)."""
    if t is None or t.shape[axis] == 1:
        return t
    return t[lo:hi] if axis == 0 else t[:, lo:hi]


def _chunked_forward(q, k, v, mask, softmax, axis, bounds):
    """(o [b, h, sq, dv], [P of each slice]): softmax(q k^T) v, slice by slice."""
    probs, outs = [], []
    for lo, hi in bounds:
        scores = torch.matmul(_take(q, axis, lo, hi), _take(k, axis, lo, hi).transpose(-2, -1))
        p = softmax(scores, _take(mask, axis, lo, hi))
        del scores  # only one slice's scores at a time
        probs.append(p)
        outs.append(torch.matmul(p, _take(v, axis, lo, hi)))
    return torch.cat(outs, dim=axis), probs


class _ChunkedCore(torch.autograd.Function):
    """o = softmax(q k^T) v over slices, P saved per slice; the backward, slice by slice:
    dV = P^T dO, dP = dO V^T, dS = <softmax>_bwd(dP, P, scale), dQ = dS K, dK = dS^T Q."""

    @staticmethod
    def forward(ctx, q, k, v, mask, softmax, bwd, scale, axis, bounds):
        with _below_autograd():
            o, probs = _chunked_forward(q, k, v, mask, softmax, axis, bounds)
        ctx.save_for_backward(q, k, v, *probs)
        ctx.bwd, ctx.scale, ctx.axis, ctx.bounds = bwd, scale, axis, bounds
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, *probs = ctx.saved_tensors
        axis = ctx.axis
        dq, dk, dv = [], [], []
        with _below_autograd():
            for (lo, hi), p in zip(ctx.bounds, probs):
                do_c, q_c, k_c, v_c = (_take(t, axis, lo, hi) for t in (do, q, k, v))
                dv.append(torch.matmul(p.transpose(-2, -1), do_c))
                dp = torch.matmul(do_c, v_c.transpose(-2, -1))
                ds = ctx.bwd(dp, p, ctx.scale)
                del dp  # only one slice's dP and dS at a time
                dq.append(torch.matmul(ds, k_c))
                dk.append(torch.matmul(ds.transpose(-2, -1), q_c))
                del ds
        cat = [torch.cat(g, dim=axis) for g in (dq, dk, dv)]
        return (*cat, None, None, None, None, None, None)


def chunked_core(q, k, v, mask, softmax, scale, plan):
    """softmax(q k^T) v [b, h, sq, dv] over the slices of ``plan`` (chunk_bounds), for plain
    eager calls. q/k/v [b, h, s, d] (k and v with h heads); mask: what ``softmax(scores,
    mask)`` takes, sliced with the scores where it is not broadcast on that axis; the
    backward uses scaled_softmax_bwd (every te_fast softmax has the same backward)."""
    axis, bounds = plan
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        bwd = _PAIRS["scaled_softmax_fwd"][1]
        return _ChunkedCore.apply(q, k, v, mask, softmax, bwd, scale, axis, bounds)
    with _below_autograd():
        return _chunked_forward(q, k, v, mask, softmax, axis, bounds)[0]
