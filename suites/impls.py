"""Implementation adapters: what each one supports (as data) and how to call it.

Add an implementation by subclassing Adapter (suites/adapter.py), declaring what it supports and
which CAPABILITIES it has, and listing it in ADAPTERS; the suites generate their parametrization
from these declarations and skip the rest with the reasons `not_supported_reasons` and `lacks`
give.
`--impl NAME` selects adapters.
"""

from __future__ import annotations

import pytest
import torch

from suites.adapter import CAPABILITIES, Adapter  # noqa: F401  (re-exported)
from suites.cases import AttnCase
from suites.te_adapter import TransformerEngine


class TeFast(Adapter):
    """te_fast.UnfusedDotProductAttention, eager."""

    name = "te_fast"
    dropout = dropout_ctx = validates_arguments = capturable = sync_free = True
    supports_fp8 = True

    def unavailable_reason(self, device):
        import te_fast

        return te_fast.device_unavailable_reason(device)

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        import contextlib

        from te_fast import UnfusedDotProductAttention

        return UnfusedDotProductAttention(
            scale,
            attention_type=case.attention_type,
            attention_dropout=dropout,
            attention_dropout_ctx=dropout_ctx or contextlib.nullcontext,
            softmax_type=case.softmax_type,
            return_max_logit=case.return_max_logit,
            num_attention_heads=case.h if case.offset_via == "param" else None,
        ).to(case.device)

    def call(self, module, case, q, k, v, kwargs):
        stand_in = {}
        if case.softmax_type == "learnable" and case.offset_via == "param":
            # the module owns the offset: load the case's values into its parameter
            kwargs = dict(kwargs)
            offset = kwargs.pop("softmax_offset")
            with torch.no_grad():
                module.softmax_offset.copy_(offset)
            stand_in["offset"] = module.softmax_offset
        out, max_logit, _ = super().call(module, case, q, k, v, kwargs)
        return out, max_logit, stand_in


class TorchSdpa(Adapter):
    """torch.nn.functional.scaled_dot_product_attention, as an example of a plugged-in impl."""

    name = "torch.sdpa"
    layouts = ("bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bs3hd", "bsh3d", "sb3hd", "sbh3d")
    mask_types = ("no_mask", "causal", "arbitrary")
    bias_types = ("no_bias",)
    softmax_types = ("vanilla",)
    supports_max_logit = False
    supports_window = False
    # claimed (torch's sdpa kernels are widely run under CUDA graphs); a GPU run with
    # --impl torch.sdpa checks it
    capturable = sync_free = True
    why_not = {
        "dropout": "the adapter does not pass dropout_p to scaled_dot_product_attention",
        "dropout_ctx": "the adapter has no dropout (scaled_dot_product_attention takes no RNG "
        "context either)",
        "validates_arguments": "it takes no qkv_layout, cu_seqlens, bias or window arguments to "
        "check: the adapter translates valid cases only",
    }
    default = False

    def not_supported_reasons(self, case):
        reasons = super().not_supported_reasons(case)
        if case.mask_type == "causal" and case.sq != case.skv:
            reasons.append("torch.sdpa is_causal is top-left only for square problems here")
        if case.bottom_right_diagonal is not None:
            reasons.append("torch.sdpa takes no bottom_right_diagonal (alignment override)")
        return reasons

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        if dropout or dropout_ctx is not None:
            raise NotImplementedError(self.lacks("dropout"))
        return _Sdpa(case, scale)


class _Sdpa(torch.nn.Module):
    def __init__(self, case: AttnCase, scale: float):
        super().__init__()
        self.case, self.scale = case, scale

    def forward(self, q, k, v, qkv_layout, attn_mask_type, attention_mask=None):
        case, fmt = self.case, self.case.layout_info.q_format

        def heads_first(t):  # -> (b, h, s, d)
            return t.permute(1, 2, 0, 3) if fmt == "sbhd" else t.permute(0, 2, 1, 3)

        out = torch.nn.functional.scaled_dot_product_attention(
            heads_first(q), heads_first(k), heads_first(v),
            attn_mask=None if attention_mask is None else ~attention_mask,
            is_causal=attn_mask_type == "causal", scale=self.scale, enable_gqa=case.h != case.hg,
        )  # fmt: skip
        out = out.nan_to_num(0.0)  # sdpa gives NaN for fully masked rows; SPEC §2 wants 0
        b, h, sq, dv = out.shape
        if fmt == "sbhd":
            return out.permute(2, 0, 1, 3).reshape(sq, b, h * dv)
        return out.permute(0, 2, 1, 3).reshape(b, sq, h * dv)


ADAPTERS: dict[str, Adapter] = {a.name: a for a in (TeFast(), TorchSdpa(), TransformerEngine())}


def selected(config, pool: dict[str, Adapter] | None = None) -> list[Adapter]:
    """The adapters chosen with --impl (default: every adapter marked default)."""
    pool = ADAPTERS if pool is None else pool
    names = config.getoption("--impl") if config is not None else None
    if not names:
        return [a for a in pool.values() if a.default]
    unknown = [n for n in names if n not in pool]
    if unknown:
        raise pytest.UsageError(f"--impl {unknown}: unknown; known adapters: {sorted(pool)}")
    return [pool[n] for n in names]


def require(adapter: Adapter, capability: str) -> None:
    """Skip the running test, with the adapter's reason, unless it has ``capability``."""
    reason = adapter.lacks(capability)
    if reason:
        pytest.skip(reason)


# The tests that need a capability ran on te_fast alone before adapters declared capabilities;
# te_fast keeps their ids (no adapter name) so that reports still compare with older baselines.
UNNAMED_IN_IDS = "te_fast"


def parametrize_per_adapter(metafunc, axes: dict) -> None:
    """Parametrize over ``axes`` (argname -> values, in id order, as stacked parametrize
    decorators would) and over the selected adapters (argument ``adapter``), which join the last
    axis: its id is bare for te_fast and gains ``-<adapter name>`` for any other adapter."""
    *leading, (last, values) = axes.items()
    for argname, argvalues in leading:
        metafunc.parametrize(argname, argvalues)
    params = []
    for adapter in selected(metafunc.config):
        suffix = "" if adapter.name == UNNAMED_IN_IDS else f"-{adapter.name}"
        for value in values:
            if not hasattr(value, "marks"):  # a plain value, not a pytest.param
                value = pytest.param(value, id=str(value))
            base = value.id if value.id is not None else str(value.values[0])
            params.append(pytest.param(adapter, *value.values, id=base + suffix, marks=value.marks))
    metafunc.parametrize(f"adapter,{last}", params)
