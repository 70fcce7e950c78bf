"""The attention core: BMM1 -> te_fast softmax -> BMM2 and its backward over slices of the
scores, in plain eager calls as one lean ``autograd.Function`` and in traces as the ops
``te_fast::attention_core`` and ``te_fast::attention_core_backward``, defined here from their
rows in te_fast/_registry.py (PYTHON_OPS), whose kernels are the same Python functions.
"""

from __future__ import annotations

import torch

from te_fast import _registry as reg
from te_fast._eager_softmax import plain_eager, softmax
from te_fast._loader import UNAVAILABLE_REASON
from te_fast._registry import SOFTMAX_KINDS

_below_autograd = torch._C._AutoDispatchBelowAutograd
_functorch_active = torch._C._are_functorch_transforms_active


def _op(name: str):
    return getattr(torch.ops.te_fast, name).default


# ----------------------------------------------------------------------------- the core
# fp16/bf16 attention (vanilla softmax, no bias, no active dropout, no max_logit) with enough
# scores runs BMM1 -> softmax -> BMM2 and its backward here, as one autograd node, which removes
# two costs of recording torch.matmul and the softmax separately:
# - Copies. q, k and v reach the core as permuted views of bshd/sbhd/thd tensors. torch.matmul
#   folds (b, h) into one batch axis, and for bshd that is not a view: autograd's path copied q,
#   k, v, the output and dO (at b16 h32 s2048 d128 bf16 on an H200: five copies, about a sixth
#   of the step; docs/performance.md). Here every GEMM runs on the strided
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
# Plain eager calls record it as _Core, a lean autograd.Function. Traces (torch.compile, export)
# call the ops registered at the end of this file instead: opaque to the compiler, so the slices
# stay slices (traced through, the loop would be unrolled into the graph, its out= GEMMs
# functionalized and the slices left to the compiler's scheduling: the trace of the
# whole-tensor path peaked at more than twice the eager core's memory; docs/performance.md).
# Both run the functions below, which name the softmax by its kind (SOFTMAX_KINDS: the registry's
# softmax forward rows less "_fwd"), as a trace's op arguments are strings, not callables.


def core_applies() -> bool:
    """Whether the attention core may run: in plain eager calls (as ``_Core``) and in traces (as
    the registered ops). Not under functorch transforms, eager or traced (dynamo evaluates the
    check inside torch.func.vmap as well), which keep the whole-tensor ops path as before: the
    core's ops have no vmap rule (the batched fallback cannot return the probability list) and,
    like every op with Python-registered autograd, no functorch grad."""
    return not _functorch_active()


def scores_softmax(kind: str, scores, mask, scale: float):
    """The te_fast softmax ``kind`` (one of SOFTMAX_KINDS) over attention scores (b, h, sq, skv),
    through ``softmax`` (autograd as there): the upper-triangular kernel on the rows (b * h, sq,
    skv); the masked one with mask bool (b|1, h|1, sq|1, skv), True = masked out (per-head masks
    give each (batch, head) row block a "batch" entry of its own); the others as they are."""
    b, h, sq, skv = scores.shape
    name = f"{kind}_fwd"
    if kind == "scaled_upper_triang_masked_softmax":
        return softmax(name, scores, None, scale, rows=(b * h, sq, skv))
    if kind != "scaled_masked_softmax":
        return softmax(name, scores, None, scale)
    if mask.shape[1] == 1:  # one mask per batch element (or one for all)
        return softmax(name, scores, mask.expand(-1, 1, sq, skv), scale)
    per_head = mask.expand(b, h, sq, skv).reshape(b * h, 1, sq, skv)
    return softmax(name, scores, per_head, scale, rows=(b * h, 1, sq, skv))


def chunk_bounds(b: int, h: int, sq: int, skv: int, itemsize: int, limit: int):
    """(axis, [(lo, hi), ...]) splitting the scores [b, h, sq, skv] into slices of at most
    ``limit`` bytes along the batch axis (0), or the head axis (1) when there are fewer batch
    elements than slices; None when one piece fits. (Sizes may be SymInts: in a trace the
    branches and the slice count become guards, the edges expressions of the sizes.)"""
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
    buffer and copy back, as compute-sanitizer's initcheck found.) The fakes
    call it too, on the same strides: the layout is part of the ops' contract."""
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


def _output_like(q, v):
    """The empty output (b, h, sq, dv), laid out in memory as q is."""
    return _empty_like_layout(q, q.shape[:-1] + v.shape[-1:])


def _scores_shape(q, k, axis, lo, hi):
    """The shape of the scores of slice [lo, hi) along axis: (n, h, sq, skv) or (b, n, sq, skv)."""
    return _take(q, axis, lo, hi).shape[:-1] + (k.shape[-2],)


def _grads_like(q, k, v, needs):
    """(dq, dk, dv): empty tensors laid out as their inputs are where ``needs`` asks, else None."""
    return tuple(
        _empty_like_layout(t, t.shape) if need else None for t, need in zip((q, k, v), needs)
    )


def _core_forward(q, k, v, mask, softmax, scale, axis, bounds, keep_probs):
    """(o [b, h, sq, dv], [P of each slice] if keep_probs else []): softmax(scale q k^T) v, slice
    by slice, with the te_fast softmax kind ``softmax`` (scores_softmax); o is laid out in memory
    as q is. Below autograd."""
    o = _output_like(q, v)
    probs = []
    for lo, hi in bounds:
        q_c, k_c, v_c = (_take(t, axis, lo, hi) for t in (q, k, v))
        scores = q.new_empty(_scores_shape(q, k, axis, lo, hi))
        _matmul_into(q_c, k_c.transpose(-2, -1), scores)
        p = scores_softmax(softmax, scores, _take(mask, axis, lo, hi), scale)
        del scores  # only one slice's scores at a time
        _matmul_into(p, v_c, _take(o, axis, lo, hi))
        if keep_probs:
            probs.append(p)
    return o, probs


def scores_softmax_backward(kind: str, dp, p, scale: float):
    """dS from dP and P (b, h, sq, skv) for the te_fast softmax ``kind``: every kind has the
    backward formula of scaled_softmax_bwd, and a kind whose backward op has a causal mask mode
    (the op table's) computes it over each row's kept prefix alone, where P is nonzero (SPEC §3):
    about half of dP and P read at sq = skv. A rank-3 op runs on the rows (b * h, sq, skv), as
    in scores_softmax."""
    spec = reg.BY_NAME[f"{kind}_bwd"]
    if not spec.causal:
        return _op("scaled_softmax_bwd")(dp, p, scale)
    if spec.rank == 3:
        rows = (-1,) + tuple(p.shape[-2:])
        return _op(spec.name)(dp.view(rows), p.view(rows), scale).view(p.shape)
    return _op(spec.name)(dp, p, scale)


def _core_backward(do, q, k, v, probs, softmax, scale, axis, bounds, needs):
    """(dq, dk, dv), None where ``needs`` (three bools) says no, slice by slice: dV = P^T dO,
    dP = dO V^T, dS = the softmax kind's backward of (dP, P) (scores_softmax_backward),
    dQ = dS K, dK = dS^T Q; each gradient laid out in memory as its input is. Below autograd."""
    need_q, need_k, need_v = needs
    dq, dk, dv = _grads_like(q, k, v, needs)
    for (lo, hi), p in zip(bounds, probs):
        do_c, q_c, k_c, v_c = (_take(t, axis, lo, hi) for t in (do, q, k, v))
        if need_v:
            _matmul_into(p.transpose(-2, -1), do_c, _take(dv, axis, lo, hi))
        if not (need_q or need_k):
            continue
        dp = _matmul_into(do_c, v_c.transpose(-2, -1), torch.empty_like(p))
        ds = scores_softmax_backward(softmax, dp, p, scale)
        del dp  # only one slice's dP and dS at a time
        if need_q:
            _matmul_into(ds, k_c, _take(dq, axis, lo, hi))
        if need_k:
            _matmul_into(ds.transpose(-2, -1), q_c, _take(dk, axis, lo, hi))
        del ds
    return dq, dk, dv


class _Core(torch.autograd.Function):
    """o = softmax(scale q k^T) v over slices (_core_forward), P saved per slice; the backward
    is _core_backward. Plain eager calls only (the registered ops are the traced equivalent)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, softmax, scale, axis, bounds):
        with _below_autograd():
            o, probs = _core_forward(q, k, v, mask, softmax, scale, axis, bounds, True)
        ctx.save_for_backward(q, k, v, *probs)
        ctx.softmax, ctx.scale, ctx.axis, ctx.bounds = softmax, scale, axis, bounds
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, *probs = ctx.saved_tensors
        with _below_autograd():
            grads = _core_backward(
                do, q, k, v, probs, ctx.softmax, ctx.scale, ctx.axis, ctx.bounds,
                ctx.needs_input_grad[:3],
            )  # fmt: skip
        return (*grads, None, None, None, None, None)


def _edges(bounds):
    """[(lo, hi), ...] -> [lo_0, hi_0 = lo_1, ..., hi_last]: the slices as the ops take them."""
    return [lo for lo, _ in bounds] + [bounds[-1][1]]


def core(q, k, v, mask, softmax, scale, plan):
    """softmax(scale q k^T) v [b, h, sq, dv] (laid out in memory as q is) over the slices of
    ``plan`` ((axis, bounds), as chunk_bounds gives). q/k/v [b, h, s, d] (k and v with h heads),
    any strides; softmax: the te_fast softmax kind (SOFTMAX_KINDS), mask the bool (b|1, h|1,
    sq|1, skv) it takes (scaled_masked_softmax only), sliced with the scores where it is not
    broadcast on that axis. Plain eager calls run _Core; traces the op te_fast::attention_core
    (P is kept only where q, k or v need a gradient: inference frees it slice by slice)."""
    axis, bounds = plan
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if not plain_eager():
        op = torch.ops.te_fast.attention_core.default
        return op(q, k, v, mask, softmax, scale, axis, _edges(bounds), grad)[0]
    if grad:
        return _Core.apply(q, k, v, mask, softmax, scale, axis, bounds)
    with _below_autograd():
        return _core_forward(q, k, v, mask, softmax, scale, axis, bounds, False)[0]


# ----------------------------------------------------------------------------- the core as ops
# Defined here in Python rather than in csrc/ with the other ops: their kernels are the functions
# above (te_fast softmax ops and aten GEMMs), one implementation for CPU and CUDA. Their names,
# schemas (with notes), tags and backward ops are their rows in te_fast/_registry.py PYTHON_OPS.
_CORE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_core(op, q, k, v, mask, softmax, axis, edges):
    """The slices [(lo, hi), ...] of ``edges``, once the arguments are checked (real and fake
    kernels alike; torch._check, so that symbolic sizes guard rather than break a trace)."""
    torch._check(
        softmax in SOFTMAX_KINDS,
        lambda: f"te_fast: {op} expects softmax to be one of {SOFTMAX_KINDS}, got {softmax!r}",
    )
    torch._check(
        (mask is not None) == (softmax == "scaled_masked_softmax"),
        lambda: f"te_fast: {op} takes a mask with softmax='scaled_masked_softmax', and only there",
    )
    torch._check(
        q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
        lambda: (
            f"te_fast: {op} expects q, k, v of shape [b, h, s, d], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        ),
    )
    b, h, _, d = q.shape
    torch._check(
        k.shape[0] == b and k.shape[1] == h and k.shape[3] == d
        and v.shape[0] == b and v.shape[1] == h and v.shape[2] == k.shape[2],
        lambda: f"te_fast: {op} expects k [b, h, skv, d] and v [b, h, skv, dv] for q "
        f"{tuple(q.shape)}, got {tuple(k.shape)}, {tuple(v.shape)}",
    )  # fmt: skip
    torch._check(
        q.dtype in _CORE_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype,
        lambda: (
            f"te_fast: {op} expects q, k, v of one dtype, float16, bfloat16 or float32, got "
            f"{q.dtype}, {k.dtype}, {v.dtype}"
        ),
    )
    if mask is not None:
        sq, skv = q.shape[2], k.shape[2]
        torch._check(
            mask.dtype == torch.bool and mask.dim() == 4
            and all(m == 1 or m == s for m, s in zip(mask.shape, (b, h, sq, skv))),
            lambda: f"te_fast: {op} expects a bool mask broadcastable to the scores "
            f"{(b, h, sq, skv)}, got {mask.dtype} {tuple(mask.shape)}",
        )  # fmt: skip
    torch._check(
        axis in (0, 1) and len(edges) >= 2 and edges[0] == 0 and edges[-1] == q.shape[axis],
        lambda: (
            f"te_fast: {op} expects axis 0 or 1 and edges [0, ..., q.shape[axis]], got "
            f"axis {axis}, edges {list(edges)} for q {tuple(q.shape)}"
        ),
    )
    bounds = list(zip(edges[:-1], edges[1:]))
    for lo, hi in bounds:
        torch._check(lo < hi, lambda: f"te_fast: {op} expects increasing edges, got {edges}")
    return bounds


def _attention_core(q, k, v, mask, softmax, scale, axis, edges, keep_probs):
    bounds = _check_core("attention_core", q, k, v, mask, softmax, axis, edges)
    return _core_forward(q, k, v, mask, softmax, scale, axis, bounds, keep_probs)


def _attention_core_fake(q, k, v, mask, softmax, scale, axis, edges, keep_probs):
    bounds = _check_core("attention_core", q, k, v, mask, softmax, axis, edges)
    probs = [q.new_empty(_scores_shape(q, k, axis, lo, hi)) for lo, hi in bounds]
    return _output_like(q, v), probs if keep_probs else []


def _check_core_backward(grad_out, q, k, v, probs, softmax, axis, edges):
    op = "attention_core_backward"
    torch._check(
        softmax in SOFTMAX_KINDS,
        lambda: f"te_fast: {op} expects softmax to be one of {SOFTMAX_KINDS}, got {softmax!r}",
    )
    bounds = _check_core(op, q, k, v, None, "scaled_softmax", axis, edges)
    torch._check(
        grad_out.shape == q.shape[:-1] + v.shape[-1:] and grad_out.dtype == q.dtype,
        lambda: (
            f"te_fast: {op} expects grad_out of the output's shape and dtype "
            f"{tuple(q.shape[:-1] + v.shape[-1:])} {q.dtype}, got {tuple(grad_out.shape)} "
            f"{grad_out.dtype}"
        ),
    )
    torch._check(
        len(probs) == len(bounds)
        and all(
            p.shape == _scores_shape(q, k, axis, lo, hi) and p.dtype == q.dtype
            for p, (lo, hi) in zip(probs, bounds)
        ),
        lambda: (
            f"te_fast: {op} expects the probabilities attention_core returned, one "
            f"{q.dtype} tensor per slice of edges {list(edges)}, got "
            f"{[(tuple(p.shape), p.dtype) for p in probs]}"
        ),
    )
    return bounds


def _attention_core_backward(
    grad_out, q, k, v, probs, softmax, scale, axis, edges, output_mask
):  # fmt: skip
    bounds = _check_core_backward(grad_out, q, k, v, probs, softmax, axis, edges)
    return _core_backward(grad_out, q, k, v, probs, softmax, scale, axis, bounds, output_mask)


def _attention_core_backward_fake(
    grad_out, q, k, v, probs, softmax, scale, axis, edges, output_mask
):  # fmt: skip
    _check_core_backward(grad_out, q, k, v, probs, softmax, axis, edges)
    return _grads_like(q, k, v, output_mask)


def _setup_core_context(ctx, inputs, output):
    q, k, v, _, softmax, scale, axis, edges, keep_probs = inputs
    if not keep_probs:
        raise RuntimeError(
            "te_fast: attention_core(..., keep_probs=False) keeps no probabilities for a "
            "backward; pass keep_probs=True where q, k or v require grad"
        )
    _, probs = output
    ctx.mark_non_differentiable(*probs)  # the backward's inputs, nothing to differentiate
    ctx.set_materialize_grads(False)  # (no zero-filled gradients for them: P's worth of bytes)
    ctx.save_for_backward(q, k, v, *probs)
    ctx.softmax, ctx.scale, ctx.axis, ctx.edges = softmax, scale, axis, edges


_CORE_BACKWARD = reg.PYTHON_BY_NAME["attention_core"].backward  # attention_core_backward


def _core_autograd_backward(ctx, grad_out, _grad_probs):
    q, k, v, *probs = ctx.saved_tensors
    grads = (None, None, None)
    if grad_out is not None:
        grads = _op(_CORE_BACKWARD)(
            grad_out, q, k, v, probs, ctx.softmax, ctx.scale, ctx.axis, ctx.edges,
            ctx.needs_input_grad[:3],
        )  # fmt: skip
    return (*grads, None, None, None, None, None, None)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(
        "te_fast: the attention core does not support double backward "
        "(attention_core_backward has no derivative); the module's whole-tensor path does: "
        "raise UnfusedDotProductAttention.core_min_score_bytes above the call's scores"
    )


def _tags(spec: reg.PythonOpSpec) -> tuple:
    """The row's torch.Tag values; a tag this torch lacks is skipped (getattr: a torch without
    needs_exact_strides still registers the ops; inductor then keeps custom ops' strides by
    default, as 2.11 and 2.13 do)."""
    found = (getattr(torch.Tag, name, None) for name in spec.tags)
    return tuple(t for t in found if t is not None)


# name -> (kernel, fake, autograd backward, setup_context): what each row of PYTHON_OPS runs
_KERNELS = {
    "attention_core": (
        _attention_core,
        _attention_core_fake,
        _core_autograd_backward,
        _setup_core_context,
    ),
    "attention_core_backward": (
        _attention_core_backward,
        _attention_core_backward_fake,
        _no_double_backward,
        None,
    ),
}


def _register_core_ops() -> None:
    for spec in reg.PYTHON_OPS:
        kernel, fake, backward, setup_context = _KERNELS[spec.name]
        qualname = f"te_fast::{spec.name}"
        torch.library.define(qualname, spec.schema, tags=_tags(spec))
        torch.library.impl(qualname, ("cpu", "cuda"), kernel)
        torch.library.register_fake(qualname, fake)
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)


if UNAVAILABLE_REASON is None:
    _register_core_ops()
