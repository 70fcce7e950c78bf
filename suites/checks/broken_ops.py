"""Deliberately broken custom ops, each breaking one SPEC §3 contract (for test_selftest.py)."""

from __future__ import annotations

import os

import torch


@torch.library.custom_op("te_selftest::writes_its_input", mutates_args=())
def writes_its_input(x: torch.Tensor) -> torch.Tensor:
    """Declared pure, but scales its input in place."""
    y = torch.softmax(x, -1)
    x.mul_(0.5)
    return y


@writes_its_input.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("te_selftest::default_stream_launch", mutates_args=())
def default_stream_launch(x: torch.Tensor) -> torch.Tensor:
    """Launches on the device's default stream instead of the current one."""
    with torch.cuda.stream(torch.cuda.default_stream(x.device)):
        return torch.softmax(x, -1)


@default_stream_launch.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("te_selftest::reads_item", mutates_args=())
def reads_item(x: torch.Tensor) -> torch.Tensor:
    """Reads a device value on the host (.item()): a host synchronisation."""
    scale = 1.0 / max(float(x.abs().max().item()), 1.0)
    return torch.softmax(x * scale, -1)


@reads_item.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("te_selftest::last_row_unwritten", mutates_args=())
def last_row_unwritten(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of a 2-D x that leaves the output's last row as allocated."""
    y = torch.empty_like(x)
    y[:-1] = torch.softmax(x[:-1], -1)
    return y


@last_row_unwritten.register_fake
def _(x):
    return torch.empty_like(x)


# ----------------------------------------------------------------------------- broken stand-ins
# Called as impl(op name, *args) in place of torch.ops.te_fast.<name>.default (the fuzz checks'
# `impl` argument); each breaks one contract and otherwise returns the right values.


def _real(name, *args):
    return getattr(torch.ops.te_fast, name).default(*args)


def convert_no_copy(name, *args):
    """A "no-copy fast path": a conversion with nothing to pad or drop (every sequence full, no
    token past cu_seqlens[-1]) returns a view of its input: an output that aliases an input."""
    data, cu = args[0], args[1]
    if name == "convert_thd_to_bshd":
        b, s = args[2], args[3]
        if s > 0 and data.shape[0] == b * s and cu.tolist() == list(range(0, b * s + 1, s)):
            return data.unflatten(0, (b, s))
    elif name == "convert_bshd_to_thd":
        b, s = data.shape[0], data.shape[1]
        if s > 0 and args[2] == b * s and cu.tolist() == list(range(0, b * s + 1, s)):
            return data.flatten(0, 1)  # a view where the strides allow it
    return _real(name, *args)


def masks_in_place(name, *args):
    """The masked forward writes -inf into x's masked positions (in place) before the softmax."""
    out = _real(name, *args)
    if name == "scaled_masked_softmax_fwd":
        x, mask = args[0], args[1]
        try:
            x.detach().masked_fill_(mask, float("-inf"))
        except RuntimeError:  # an expanded x cannot be written in place
            pass
    return out


def subtracts_in_dy(name, *args):
    """The backward forms dy - sum(dy * y) in dy's own storage."""
    out = _real(name, *args)
    if name.endswith("_bwd"):
        dy, y = args[0], args[1]
        dot = (dy.float() * y.float()).sum(-1, keepdim=True).to(dy.dtype)
        try:
            dy.detach().sub_(dot)
        except RuntimeError:  # an expanded dy cannot be written in place
            pass
    return out


def dx_in_dy(name, *args):
    """The backward writes dx over dy and returns dy: an output that aliases an input."""
    out = _real(name, *args)
    if name.endswith("_bwd"):
        dy = args[0]
        try:
            dy.detach().copy_(out)
        except RuntimeError:  # an expanded dy cannot be written in place
            return out
        return dy
    return out


def keeps_input_strides(name, *args):
    """Allocates the output like its first input (torch.empty_like keeps a transposed layout),
    while the registered fake says contiguous."""
    out = _real(name, *args)
    if not name.startswith("scaled_"):
        return out
    like = torch.empty_like(args[0])
    like.copy_(out)
    return like


def uniform_masked_rows(name, *args):
    """A fully masked row comes out uniform (1/sk), not 0."""
    out = _real(name, *args)
    if name == "scaled_masked_softmax_fwd" and out.shape[-1]:
        dead = args[1].all(dim=-1, keepdim=True).expand_as(out)
        out = out.masked_fill(dead, 1.0 / out.shape[-1])
    return out


# ----------------------------------------------------------------------------- broken modules


def _broken_adapters():
    """Adapters (suites/adapters/) around te_fast's module, each breaking one module contract."""
    from te_conformance.suites import adapters as impls
    from te_fast import UnfusedDotProductAttention

    class PrescalesQuery(UnfusedDotProductAttention):
        """Applies the softmax scale to the caller's query tensor, in place."""

        def forward(self, query_layer, key_layer, value_layer, **kwargs):
            query_layer.detach().mul_(2.0)
            scale, self.softmax_scale = self.softmax_scale, self.softmax_scale / 2.0
            try:
                return super().forward(query_layer, key_layer, value_layer, **kwargs)
            finally:
                self.softmax_scale = scale

    class SingleKeyIsValue(UnfusedDotProductAttention):
        """A "fast path": one query, one key, nothing masked, plain softmax: the output is v,
        returned as a view of the caller's value tensor."""

        def forward(self, query_layer, key_layer, value_layer, **kwargs):
            plain = all(
                kwargs.get(name) in (None, default)
                for name, default in (("attn_mask_type", "no_mask"), ("window_size", None),
                                      ("core_attention_bias_type", "no_bias"))
            )  # fmt: skip
            b, sq, h, _ = query_layer.shape
            if (
                plain and kwargs.get("qkv_layout", "").startswith("bs")
                and sq == 1 and key_layer.shape[1] == 1 and key_layer.shape[2] == h
                and self.softmax_type == "vanilla" and not self.return_max_logit
            ):  # fmt: skip
                return value_layer.reshape(b, 1, -1)
            return super().forward(query_layer, key_layer, value_layer, **kwargs)

    class IgnoresScale(UnfusedDotProductAttention):
        """Built with a softmax_scale, computes at the default d ** -0.5 whatever it was."""

        def forward(self, query_layer, key_layer, value_layer, **kwargs):
            scale, self.softmax_scale = self.softmax_scale, query_layer.shape[-1] ** -0.5
            try:
                return super().forward(query_layer, key_layer, value_layer, **kwargs)
            finally:
                self.softmax_scale = scale

    def adapter(name, module_cls):
        class Broken(impls.TeFast):
            def build(self, case, scale, dropout=0.0):
                module = super().build(case, scale, dropout)
                module.__class__ = module_cls
                return module

        Broken.name = name
        return Broken()

    class JitteryOutput(UnfusedDotProductAttention):
        """One output element, picked by the global RNG, one ulp off (varies run to run)."""

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            return _bump(out, int(torch.randint(out.numel(), ()))) if out.numel() else out

    class UnseededDropout(UnfusedDotProductAttention):
        """Dropout from a private generator seeded from the OS: torch.manual_seed has no effect."""

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            if not (self.training and self.attention_dropout):
                return out
            gen = torch.Generator(device=out.device).manual_seed(
                int.from_bytes(os.urandom(4), "little")
            )
            keep = torch.rand(out.shape, generator=gen, device=out.device) >= self.attention_dropout
            return out * keep

    return {
        "selftest.mutates_query": adapter("selftest.mutates_query", PrescalesQuery),
        "selftest.aliases_value": adapter("selftest.aliases_value", SingleKeyIsValue),
        "selftest.ignores_scale": adapter("selftest.ignores_scale", IgnoresScale),
        "selftest.jittery_output": adapter("selftest.jittery_output", JitteryOutput),
        "selftest.unseeded_dropout": adapter("selftest.unseeded_dropout", UnseededDropout),
    }


class _LazyAdapters(dict):
    """Built on first use: importing te_fast here at import time is not needed elsewhere."""

    def __missing__(self, key):
        self.update(_broken_adapters())
        return dict.__getitem__(self, key)


BROKEN_ADAPTERS = _LazyAdapters()


# ----------------------------------------------------------------------------- nondeterminism


def _bump(t: torch.Tensor, index: int) -> torch.Tensor:
    """t with element ``index`` (flat) moved one ulp up, through an exact (differentiable) add."""
    flat = t.detach().reshape(-1)
    value = flat[index : index + 1]
    delta = torch.zeros_like(flat)
    delta[index : index + 1] = (
        torch.nextafter(value.float(), torch.tensor(float("inf"))).to(t.dtype) - value
    )
    return t + delta.view_as(t)


def jittery(name, *args):
    """Like an atomics-based reduction whose order varies: one element of the output, picked by
    the global RNG (a different one each call), is one ulp off."""
    out = _real(name, *args)
    if out.numel() == 0:
        return out
    return _bump(out, int(torch.randint(out.numel(), ())))


def batch_variant(name, *args):
    """Splits each row's sum into more pieces when the batch holds more than one element, as a
    grid-size-dependent split reduction does (fp32 rounding then depends on the batch)."""
    if name != "scaled_softmax_fwd":
        return _real(name, *args)
    x, scale = args
    s = x.double().float() * scale
    e = (s - s.amax(-1, keepdim=True)).exp()
    pieces = 1 if x.shape[0] == 1 else 7
    total = sum(chunk.sum(-1, keepdim=True) for chunk in e.chunk(pieces, -1))
    return (e / total).to(x.dtype)
