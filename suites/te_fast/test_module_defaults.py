"""te_fast's UnfusedDotProductAttention keeps Transformer Engine 2.20.2's defaults (SPEC §7): the
constructor's and forward's, as TE's unfused backend declares them
(transformer_engine/pytorch/attention/dot_product_attention/backends.py, class
UnfusedDotProductAttention: ``__init__`` at 380-389, ``_forward`` at 438-463), and a call that
leaves them out computes what the call that passes them does."""

from __future__ import annotations

import contextlib
import inspect

import pytest
import torch

import te_fast
from te_conformance.reports import record

# TE 2.20.2's defaults, typed from the lines cited above (the arguments te_fast takes too;
# softcap, inference_params, fp8_meta and quantizers are TE's alone).
TE_INIT_DEFAULTS = {
    "attention_type": "self",
    "attention_dropout": 0.0,
    "attention_dropout_ctx": contextlib.nullcontext,
    "layer_number": None,
    "softmax_type": "vanilla",
    "return_max_logit": False,
}
TE_FORWARD_DEFAULTS = {
    "qkv_layout": "sbh3d",
    "cu_seqlens_q": None,
    "cu_seqlens_kv": None,
    "max_seqlen_q": None,
    "max_seqlen_kv": None,
    "attn_mask_type": "causal",
    "attention_mask": None,
    "window_size": None,
    "bottom_right_diagonal": None,
    "core_attention_bias_type": "no_bias",
    "core_attention_bias": None,
    "alibi_slopes": None,
    "softmax_offset": None,
    "fp8": False,
    "fp8_output": False,
}


def _defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}  # fmt: skip


@pytest.mark.parametrize(
    "function,want",
    [(te_fast.UnfusedDotProductAttention.__init__, TE_INIT_DEFAULTS),
     (te_fast.UnfusedDotProductAttention.forward, TE_FORWARD_DEFAULTS)],
    ids=["init", "forward"],
)  # fmt: skip
def test_signature_defaults_are_te_s(function, want):
    record.case(impl="te_fast", layout="module", mask_type=function.__name__, device="cpu")
    got = _defaults(function)
    differ = {n: (got.get(n, "<required>"), v) for n, v in want.items() if got.get(n, ...) != v}
    assert not differ, f"defaults that are not TE 2.20.2's (te_fast, TE): {differ}"


def test_a_call_without_arguments_is_the_sbh3d_causal_call():
    """The defaults are applied, not merely declared: module(q, k, v) on sbh3d views is bitwise
    module(q, k, v, qkv_layout="sbh3d", attn_mask_type="causal"), and differs from no_mask
    (so the call could tell them apart), forward and dq, dk, dv."""
    record.case(impl="te_fast", layout="sbh3d", mask_type="default", device="cpu")
    s, b, h, d = 9, 2, 2, 8
    qkv = torch.randn(s, b, 3, h, d, generator=torch.Generator().manual_seed(5))
    dout = torch.randn(s, b, h * d, generator=torch.Generator().manual_seed(6))
    module = te_fast.UnfusedDotProductAttention(d**-0.5)

    def run(**kwargs):
        leaf = qkv.clone().requires_grad_()
        q, k, v = leaf.unbind(2)
        out = module(q, k, v, **kwargs)
        (grad,) = torch.autograd.grad(out, leaf, dout)
        return out.detach(), grad

    default = run()
    explicit = run(qkv_layout="sbh3d", attn_mask_type="causal")
    for name, a, e in zip(("out", "dqkv"), default, explicit):
        assert torch.equal(a, e), f"{name}: the default call differs from the sbh3d causal call"
    no_mask = run(qkv_layout="sbh3d", attn_mask_type="no_mask")
    assert not torch.equal(default[0], no_mask[0]), "precondition: causal and no_mask differ"
