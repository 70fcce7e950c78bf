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


# ----------------------------------------------------------------------------- eager core
# Plain eager fp16/bf16 attention (vanilla softmax, no bias, no active dropout, no max_logit) runs
# BMM1 -> softmax -> BMM2 and its backward here, as one autograd node, which removes two costs of
# recording torch.matmul and the softmax separately:
# - Copies. q, k and v reach the core as permuted views of bshd/sbhd/thd tensors. torch.matmul
#   folds (b, h) into one batch axis, and for bshd that is not a view: autograd's path copied q,
#   k, v, the output and dO (H200, 2026-12-04, b16 h32 s2048 d128 bf16: five copies, 2.4 ms of a
#   14.45 ms step, aten's strided copy running at ~1.1 TB/s). Here every GEMM runs on the strided
#   views themselves (cuBLAS takes any batch stride and a leading dimension per matrix: one
#   batched GEMM per batch element when (b, h) do not fold), and the output and the gradients
#   are written straight into tensors laid out as the inputs are, so that the module's final
#   permute and reshape are views.
# - Memory. An unfused attention holds the probabilities P for the backward (one [b, h, sq, skv]
#   tensor); whole-tensor steps add the scores next to P in the forward and dP and dS next to P in
#   the backward. The core runs slice by slice along the batch (or head) axis, so that besides P
#   only one slice's scores, or one slice's dP and dS, are alive.
# Every row is computed by the same kernels as on the whole tensor (te_fast's softmax rows are
# batch-invariant).


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


def _empty_like_layout(t, size):
    """An empty (b, h, s, d) tensor of ``size`` whose first three axes lie in memory in the
    order of t's strides, largest first, and whose last axis is contiguous: for a permuted view
    of a bshd tensor, a bshd tensor. (Its matrices must be ones cuBLAS writes in place: with
    an input's odd strides copied, bmm(out=) would compute into a copy of the uninitialized
    buffer and copy back, as compute-sanitizer's initcheck found on 2026-12-04.)"""
    order = sorted(range(t.dim() - 1), key=lambda i: (-t.stride(i), i)) + [t.dim() - 1]
    return torch.empty_permuted(size, order, dtype=t.dtype, device=t.device)


def _folds(t):
    """Whether t (n, h, m, k) is a view of one batch of n * h matrices: one batch stride covers
    both leading axes (bshd views: b and h have unrelated strides, they do not fold)."""
    n, h = t.shape[:2]
    return n == 1 or h == 1 or t.stride(0) == h * t.stride(1)


# A batch element's GEMM of at least this many multiply-adds (h * m * k * p) takes its own
# cuBLAS call: ~15 us of GPU time on an H200 at this size (bf16), more than the Python launch, so
# a loop over the batch keeps the GPU busy; below it (and beyond two batch elements) copying the
# operands into one batched GEMM, as torch.matmul does, costs less host time.
_LOOP_MACS = 1 << 32


def _matmul_into(a, b, out):
    """out[...] = a @ b for a (n, h, m, k), b (n, h, k, p) and out (n, h, m, p), any strides;
    returns out."""
    n, h, m, k = a.shape
    if n == 1:
        torch.bmm(a[0], b[0], out=out[0])
    elif _folds(a) and _folds(b) and _folds(out):
        torch.bmm(a.flatten(0, 1), b.flatten(0, 1), out=out.flatten(0, 1))
    elif n <= 2 or h * m * k * b.shape[-1] >= _LOOP_MACS:
        for i in range(n):
            torch.bmm(a[i], b[i], out=out[i])
    else:
        out.copy_(torch.matmul(a, b))
    return out


def _core_forward(q, k, v, mask, softmax, axis, bounds, keep_probs):
    """(o [b, h, sq, dv], [P of each slice] if keep_probs): softmax(q k^T) v, slice by slice; o
    is laid out in memory as q is."""
    b, h, sq, _ = q.shape
    o = _empty_like_layout(q, (b, h, sq, v.shape[-1]))
    probs = []
    for lo, hi in bounds:
        q_c, k_c, v_c = (_take(t, axis, lo, hi) for t in (q, k, v))
        scores = q.new_empty(q_c.shape[:-1] + (k_c.shape[-2],))  # (n, h, sq, skv)
        p = softmax(_matmul_into(q_c, k_c.transpose(-2, -1), scores), _take(mask, axis, lo, hi))
        del scores  # only one slice's scores at a time
        _matmul_into(p, v_c, _take(o, axis, lo, hi))
        if keep_probs:
            probs.append(p)
    return o, probs


class _Core(torch.autograd.Function):
    """o = softmax(q k^T) v over slices, P saved per slice; the backward, slice by slice:
    dV = P^T dO, dP = dO V^T, dS = <softmax>_bwd(dP, P, scale), dQ = dS K, dK = dS^T Q, each
    gradient laid out in memory as its input is."""

    @staticmethod
    def forward(ctx, q, k, v, mask, softmax, bwd, scale, axis, bounds):
        with _below_autograd():
            o, probs = _core_forward(q, k, v, mask, softmax, axis, bounds, True)
        ctx.save_for_backward(q, k, v, *probs)
        ctx.bwd, ctx.scale, ctx.axis, ctx.bounds = bwd, scale, axis, bounds
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, *probs = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq, dk, dv = (
            _empty_like_layout(t, t.shape) if need else None
            for t, need in ((q, need_q), (k, need_k), (v, need_v))
        )
        axis = ctx.axis
        with _below_autograd():
            for (lo, hi), p in zip(ctx.bounds, probs):
                do_c, q_c, k_c, v_c = (_take(t, axis, lo, hi) for t in (do, q, k, v))
                if need_v:
                    _matmul_into(p.transpose(-2, -1), do_c, _take(dv, axis, lo, hi))
                if not (need_q or need_k):
                    continue
                dp = _matmul_into(do_c, v_c.transpose(-2, -1), torch.empty_like(p))
                ds = ctx.bwd(dp, p, ctx.scale)
                del dp  # only one slice's dP and dS at a time
                if need_q:
                    _matmul_into(ds, k_c, _take(dq, axis, lo, hi))
                if need_k:
                    _matmul_into(ds.transpose(-2, -1), q_c, _take(dk, axis, lo, hi))
                del ds
        return dq, dk, dv, None, None, None, None, None, None


def core(q, k, v, mask, softmax, scale, plan):
    """softmax(q k^T) v [b, h, sq, dv] (laid out in memory as q is) over the slices of ``plan``
    ((axis, bounds), as chunk_bounds gives), for plain eager calls. q/k/v [b, h, s, d] (k and v
    with h heads), any strides; mask: what ``softmax(scores, mask)`` takes, sliced with the
    scores where it is not broadcast on that axis; the backward uses scaled_softmax_bwd (every
    te_fast softmax has the same backward)."""
    axis, bounds = plan
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        bwd = _PAIRS["scaled_softmax_fwd"][1]
        return _Core.apply(q, k, v, mask, softmax, bwd, scale, axis, bounds)
    with _below_autograd():
        return _core_forward(q, k, v, mask, softmax, axis, bounds, False)[0]
