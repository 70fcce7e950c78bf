"""Second-order gradients: te_fast's softmax ops and its module, differentiated twice, against a
float64 composite written here in plain torch ops, at softmax scales other than 1.

Why: te_fast claims double backward for its softmax ops (te_fast/ops.py, the autograd of the
backward ops: d/d(dy) through the backward op, d/dy an fp32 composite) and, through them, for
the module's eager softmax node (csrc/eager.cpp) below the eager core's threshold (the core
refuses double backward: test_eager_core.py). First-order checks run at many scales; a
second-order term that drops or squares the scale passes at scale 1, the one scale where
c = c^2 = 1/c. Here every call runs at 0.37 (and the ops at -1.7 too).

What is compared (SPEC §6, k = 3 for gradients): the first-order gradients, and the gradients
of s = sum_n <d_n, g_n> (random g_n for every first-order gradient d_n) with respect to every
input and to dO (dy for the ops). ref64 is the composite below in float64, ref_lp te_ref's
same-precision composite (torch.softmax, differentiated twice by autograd); te_ref in float64
must agree with the composite too (a check of the composite as much as of te_ref).
"""

from __future__ import annotations

import pytest
import torch

import te_fast
import te_ref
from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.cases import DTYPES
from te_conformance.suites.checks.numerics import K_BACKWARD, K_FORWARD, check_ratio
from te_conformance.suites.op_cases import CAUSAL_OPS, SOFTMAX_OPS

pytestmark = pytest.mark.usefixtures("one_thread")  # suites/plugin.py: tiny tensors, one thread

SCALE = 0.37
OP_SCALES = (SCALE, -1.7)
REF64_AGREEMENT = 1e-10  # te_ref float64 against the float64 composite, relative to the max


# ----------------------------------------------------------------------------- the composite


def composite_softmax(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim of the kept positions (keep: bool, broadcastable), exactly 0 at
    the others and on rows with nothing kept; the max shift is a constant (detached), so that
    autograd differentiates exp and the division only."""
    s = scores.masked_fill(~keep, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = m.masked_fill(torch.isinf(m), 0.0)
    e = torch.exp(s - m)
    den = e.sum(dim=-1, keepdim=True)
    return e / den.masked_fill(den == 0, 1.0)


def _op_keep(name: str, x: torch.Tensor, mask) -> torch.Tensor:
    """The positions each op keeps (SPEC §3): all; ~mask; top-left causal j <= i; bottom-right
    causal j <= i + sk - sq."""
    sq, sk = x.shape[-2], x.shape[-1]
    i = torch.arange(sq, device=x.device).view(sq, 1)
    j = torch.arange(sk, device=x.device).view(1, sk)
    if name == "scaled_softmax":
        return torch.ones(sq, sk, dtype=torch.bool, device=x.device)
    if name == "scaled_masked_softmax":
        return ~mask
    if name == "scaled_upper_triang_masked_softmax":
        return j <= i
    return j <= i + (sk - sq)


def second_order(fn, leaves: dict, d_out, gen) -> dict:
    """{name: tensor}: fn's output, the first-order gradients d<name> of <out, d_out>, and the
    gradients d2<name> of sum_n <d_n, g_n> (g_n from gen, the same for every caller) with
    respect to every leaf and to d_out ("d2dout")."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in leaves.items()}
    d_out = d_out.detach().clone().requires_grad_()
    out = fn(**leaves)
    names = list(leaves)
    first = torch.autograd.grad(out, [leaves[n] for n in names], d_out, create_graph=True)
    g = {n: torch.randn(t.shape, generator=gen, dtype=torch.float64) for n, t in zip(names, first)}
    s = sum((d * g[n].to(device=d.device, dtype=d.dtype)).sum() for n, d in zip(names, first))
    targets = [leaves[n] for n in names] + [d_out]
    second = torch.autograd.grad(s, targets, allow_unused=True)
    result = {"out": out.detach()}
    result.update({f"d{n}": d.detach() for n, d in zip(names, first)})
    for n, t, d2 in zip([*names, "dout"], targets, second):
        result[f"d2{n}"] = torch.zeros_like(t) if d2 is None else d2.detach()
    return result


def judge(impl: dict, ref64: dict, ref_lp: dict, comp64: dict, dtype) -> None:
    """impl against the composite (SPEC §6, bound from te_ref's same-precision composite);
    te_ref float64 against the composite (REF64_AGREEMENT)."""
    failures = []
    for name, want in comp64.items():
        err = (ref64[name] - want).abs().max().item()
        size = max(want.abs().max().item(), 1.0)
        if err > REF64_AGREEMENT * size:
            failures.append(f"te_ref float64 {name}: off the composite by {err:.3g}")
        k = K_FORWARD if name == "out" else K_BACKWARD
        try:
            check_ratio(name, impl[name], want, ref_lp[name], k, dtype)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- the ops


def _fast_op(route: str, name: str):
    """The te_fast op as a function of (x, mask, scale): through its registered autograd
    (te_fast.ops) or the eager C++ autograd node the module records (te_fast._eager_softmax)."""
    if route == "registered":
        op = SOFTMAX_OPS[name]
        return lambda x, mask, scale: op.fast(x, *((mask,) if op.masked else ()), scale)
    from te_fast import _eager_softmax

    return lambda x, mask, scale: _eager_softmax.softmax(f"{name}_fwd", x, mask, scale)


def _op_case(layout: str, name: str, dtype_name: str, device_name: str, seed: int):
    """(op, x, gen) of one op case, recorded: scores x (sq 5 != sk 7) drawn from gen."""
    record.case(impl="te_fast", layout=layout, dtype=dtype_name,
                mask_type="double_backward", device=device_name)  # fmt: skip
    device = devices.require(device_name)
    gen = torch.Generator().manual_seed(seed)
    op = SOFTMAX_OPS[name]
    shape = (6, 5, 7) if op.rank == 3 else (2, 3, 5, 7)
    x = (torch.randn(shape, generator=gen) * 2).to(device=device, dtype=DTYPES[dtype_name])
    return op, x, gen


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("route", ("registered", "eager"))
@pytest.mark.parametrize("scale", OP_SCALES, ids=lambda s: f"scale{s:g}")
@pytest.mark.parametrize("dtype_name", ("fp32", "bf16", "fp16"))
@pytest.mark.parametrize("name", list(SOFTMAX_OPS))
def test_softmax_op_double_backward(name, dtype_name, scale, route, device_name):
    """Each te_fast softmax op: y, dx and the second-order gradients with respect to x and dy,
    against the composite (a fully masked row in the masked op; sq != sk in the causal ones)."""
    op, x, gen = _op_case(f"op:{name}", name, dtype_name, device_name, 35)
    device, dtype, shape = x.device, x.dtype, x.shape
    mask = None
    if op.masked:
        mask = torch.rand((2, 1, 5, 7), generator=gen) < 0.3
        mask[0, 0, 1] = True  # a fully masked row
        mask = mask.to(device)
    dy = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    keep = _op_keep(name, x, mask)
    fast = _fast_op(route, name)

    def run(fn, compute=None):
        leaves = {"x": x if compute is None else x.to(compute)}
        d_out = dy if compute is None else dy.to(compute)
        return second_order(fn, leaves, d_out, torch.Generator().manual_seed(1))

    def ref(compute):
        extra = (mask,) if op.masked else ()
        return lambda x: op.ref(x, *extra, scale, compute_dtype=compute)

    impl = run(lambda x: fast(x, mask, scale))
    comp64 = run(lambda x: composite_softmax(scale * x, keep), torch.float64)
    ref64 = run(ref(torch.float64), torch.float64)
    ref_lp = run(ref(dtype))
    judge(impl, ref64, ref_lp, comp64, dtype)


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", ("fp32", "bf16"))
@pytest.mark.parametrize("name", CAUSAL_OPS)
def test_causal_backward_op_second_order_stays_in_the_kept_prefix(name, dtype_name, device_name):
    """The causal backward op differentiated itself (dx = <name>_bwd(dy, y, scale), then the
    gradients of sum(dx * g) with respect to dy and y): dx does not depend on dy and y past each
    row's kept prefix (SPEC §3), so both gradients are 0 there, and on the kept columns they
    match te_ref's backward differentiated by autograd (SPEC §6). y is a forward's output and dy
    random, so a composite that took whole rows gives nonzero d/dy past the prefix."""
    op, x, gen = _op_case(f"op:{name}_bwd", name, dtype_name, device_name, 36)
    device, dtype, shape = x.device, x.dtype, x.shape
    y = op.fast(x, SCALE)
    dy = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    bwd = getattr(te_fast.ops, f"{name}_bwd")
    ref_bwd = getattr(te_ref, f"{name}_bwd")

    def grads(fn, compute=None):
        leaves = [t.detach().to(compute or t.dtype).requires_grad_() for t in (dy, y)]
        dx = fn(*leaves)
        return torch.autograd.grad((dx * g.to(device=device, dtype=dx.dtype)).sum(), leaves)

    impl = grads(lambda d, p: bwd(d, p, SCALE))
    ref64 = grads(lambda d, p: ref_bwd(d, p, SCALE), torch.float64)
    ref_lp = grads(lambda d, p: ref_bwd(d, p, SCALE, compute_dtype=dtype))
    kept = te_ref.kept_columns(name, shape[-2], shape[-1], device)
    for leaf, a, r, lp in zip(("d2dy", "d2y"), impl, ref64, ref_lp):
        past = a.masked_select(~kept)
        assert torch.equal(past, torch.zeros_like(past)), f"{leaf} past the kept prefix: {past}"
        check_ratio(leaf, a, r, lp, K_BACKWARD, dtype)


# ----------------------------------------------------------------------------- the module


# name -> (attn_mask_type, softmax_type, bias_type, sq, skv): every te_fast softmax path of a
# module call (te_fast/attention.py): the plain, top-left and bottom-right causal kernels, the
# masked kernel per head (arbitrary, a fully masked row) and per batch element (padding with
# lengths), the sink (off-by-one masked, learnable with its offset as a leaf) and a bias leaf.
MODULE_CASES = {
    "no_mask": ("no_mask", "vanilla", "no_bias", 13, 13),
    "causal": ("causal", "vanilla", "no_bias", 13, 13),
    "causal_bottom_right": ("causal_bottom_right", "vanilla", "no_bias", 11, 17),
    "arbitrary": ("arbitrary", "vanilla", "no_bias", 11, 17),
    "padding_causal": ("padding_causal", "vanilla", "no_bias", 13, 13),
    "off_by_one_causal": ("causal", "off-by-one", "no_bias", 13, 13),
    "learnable": ("no_mask", "learnable", "no_bias", 11, 17),
    "post_scale_bias": ("no_mask", "vanilla", "post_scale_bias", 11, 17),
    "pre_scale_bias": ("causal", "vanilla", "pre_scale_bias", 13, 13),
}
B, H, HG, D, DV = 2, 4, 2, 16, 8  # GQA: two query heads per key/value head
LENGTHS = ([13, 7], [13, 5])  # padding_causal: (q, kv) lengths per batch element


def _module_inputs(case: str, device, dtype):
    """(leaves, forward kwargs, keep (b|1, h|1, sq, skv), dO)."""
    mask_type, softmax_type, bias_type, sq, skv = MODULE_CASES[case]
    gen = torch.Generator().manual_seed(9)

    def randn(*shape, magnitude=1.0):
        return (torch.randn(shape, generator=gen) * magnitude).to(device=device, dtype=dtype)

    leaves = {"q": randn(B, sq, H, D, magnitude=2.0), "k": randn(B, skv, HG, D, magnitude=2.0),
              "v": randn(B, skv, HG, DV)}  # fmt: skip
    kwargs = {"qkv_layout": "bshd_bshd_bshd", "attn_mask_type": mask_type}
    i = torch.arange(sq, device=device).view(sq, 1)
    j = torch.arange(skv, device=device).view(1, skv)
    keep = torch.ones(1, 1, sq, skv, dtype=torch.bool, device=device)
    if mask_type == "causal":
        keep = (j <= i).view(1, 1, sq, skv)
    elif mask_type == "causal_bottom_right":
        keep = (j <= i + skv - sq).view(1, 1, sq, skv)
    elif mask_type == "arbitrary":
        user = torch.rand((B, H, sq, skv), generator=gen) < 0.3
        user[0, 1, 2] = True  # a fully masked row
        kwargs["attention_mask"] = user.to(device)
        keep = ~kwargs["attention_mask"]
    elif mask_type == "padding_causal":
        lq, lkv = (torch.tensor(n, device=device).view(B, 1, 1, 1) for n in LENGTHS)
        keep = (i < lq) & (j < lkv) & (j <= i)  # top-left, as padding_causal is
        for name, lengths in zip(("cu_seqlens_q", "cu_seqlens_kv"), LENGTHS):
            kwargs[name] = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32,
                                        device=device)  # fmt: skip
    if bias_type != "no_bias":
        kwargs["core_attention_bias_type"] = bias_type
        leaves["bias"] = randn(1, H, sq, skv)
    if softmax_type == "learnable":
        leaves["offset"] = torch.randn(H, generator=gen).to(device)  # fp32, like TE
    d_out = randn(B, sq, H * DV)
    return leaves, kwargs, keep, d_out


def _composite_attention(case: str, keep, q, k, v, bias=None, offset=None):
    """SPEC §2 in plain torch ops on bshd q [b, sq, h, d], k and v [b, skv, hg, *]."""
    _, softmax_type, bias_type, sq, skv = MODULE_CASES[case]
    qh = q.permute(0, 2, 1, 3)
    kh = k.permute(0, 2, 1, 3).repeat_interleave(H // HG, dim=1)
    vh = v.permute(0, 2, 1, 3).repeat_interleave(H // HG, dim=1)
    qk = qh @ kh.transpose(-2, -1)  # (b, h, sq, skv)
    if bias_type == "pre_scale_bias":
        scores = SCALE * (qk + bias)
    elif bias_type == "post_scale_bias":
        scores = SCALE * qk + bias
    else:
        scores = SCALE * qk
    keep = keep.expand(B, H, sq, skv)
    if softmax_type != "vanilla":  # one more logit, never masked: 0 or softmax_offset[h]
        sink = torch.zeros(H, dtype=q.dtype, device=q.device) if offset is None else offset
        scores = torch.cat([scores, sink.to(q.dtype).view(1, H, 1, 1).expand(B, H, sq, 1)], -1)
        keep = torch.cat([keep, torch.ones_like(keep[..., :1])], dim=-1)
    p = composite_softmax(scores, keep)[..., :skv]
    return (p @ vh).permute(0, 2, 1, 3).reshape(B, sq, H * DV)


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", ("fp32", "bf16"))
@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_double_backward(case, dtype_name, device_name):
    """te_fast.UnfusedDotProductAttention at softmax_scale 0.37: out, the first-order gradients
    of q, k, v (bias, softmax_offset where leaves) and the second-order ones, with respect to
    every leaf and dO, against the composite."""
    mask_type, softmax_type, bias_type, sq, skv = MODULE_CASES[case]
    record.case(impl="te_fast", layout="bshd_bshd_bshd", dtype=dtype_name, mask_type=mask_type,
                bias_type=bias_type, softmax_type=softmax_type, device=device_name,
                table="double_backward")  # fmt: skip
    device = devices.require(device_name)
    dtype = DTYPES[dtype_name]
    leaves, kwargs, keep, d_out = _module_inputs(case, device, dtype)
    attn = te_fast.UnfusedDotProductAttention(SCALE, softmax_type=softmax_type)

    def fast(q, k, v, bias=None, offset=None):
        extra = {"core_attention_bias": bias} if bias is not None else {}
        if offset is not None:
            extra["softmax_offset"] = offset
        return attn(q, k, v, **kwargs, **extra)

    def ref(compute):
        def call(q, k, v, bias=None, offset=None):
            extra = {"core_attention_bias": bias} if bias is not None else {}
            if offset is not None:
                extra["softmax_offset"] = offset
            return te_ref.dot_product_attention(
                q, k, v, softmax_scale=SCALE, softmax_type=softmax_type,
                attention_type="self" if sq == skv else "cross", compute_dtype=compute,
                **kwargs, **extra,
            )  # fmt: skip

        return call

    def run(fn, compute=None):
        ls = leaves if compute is None else {
            n: t.to(compute) if n != "offset" or compute == torch.float64 else t
            for n, t in leaves.items()
        }  # fmt: skip
        d = d_out if compute is None else d_out.to(compute)
        return second_order(fn, ls, d, torch.Generator().manual_seed(2))

    impl = run(fast)
    comp64 = run(lambda **t: _composite_attention(case, keep, **t), torch.float64)
    ref64 = run(ref(torch.float64), torch.float64)
    ref_lp = run(ref(dtype), dtype)
    judge(impl, ref64, ref_lp, comp64, dtype)
