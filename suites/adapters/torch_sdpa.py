"""`--impl torch.sdpa`: torch.nn.functional.scaled_dot_product_attention behind the adapter."""

from __future__ import annotations

import torch

from te_conformance.suites.adapters.base import Adapter, Rule, Support, distribution_version
from te_conformance.suites.cases import AttnCase


class TorchSdpa(Adapter):
    """torch.nn.functional.scaled_dot_product_attention, as an example of a plugged-in impl."""

    def version(self):
        return distribution_version("torch")

    name = "torch.sdpa"
    support = Support(
        layouts=("bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bs3hd", "bsh3d", "sb3hd", "sbh3d"),
        mask_types=("no_mask", "causal", "arbitrary"),
        bias_types=("no_bias",),
        softmax_types=("vanilla",),
        outputs=(),
        arguments=("cu_seqlens_padding", "padding_mask", "alibi_slopes", "softmax_offset"),
        # capturable, sync_free: claimed (torch's sdpa kernels are widely run under CUDA
        # graphs); a GPU run with --impl torch.sdpa checks them. deterministic: on the CPU
        # (checked there), not claimed on CUDA
        capabilities=("traceable", "capturable", "sync_free", "deterministic", "exact_one_key"),
        capability_devices={"deterministic": ("cpu",), "exact_one_key": ("cpu",)},
        rules=(
            Rule(lambda c: c.mask_type == "causal" and c.sq != c.skv,
                 "is_causal is top-left only for square problems here", "mask_causal"),
        ),
        why={
            "deterministic": "not claimed on CUDA: scaled_dot_product_attention's docstring "
            "warns that with CUDA tensors 'this operator may select a nondeterministic "
            "algorithm' (cuDNN), and the adapter leaves torch's backend choice and determinism "
            "settings alone",
            "dropout": "the adapter does not pass dropout_p to scaled_dot_product_attention",
            "dropout_ctx": "the adapter has no dropout (scaled_dot_product_attention takes no "
            "RNG context either)",
            "validates_arguments": "it takes no qkv_layout, cu_seqlens, bias or window "
            "arguments to check: the adapter translates valid cases only",
            "fp8": "scaled_dot_product_attention has no FP8 attention with a scaling recipe",
        },
    )  # fmt: skip

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        if dropout or dropout_ctx is not None:
            raise NotImplementedError(self.declines(needs=("dropout",))[0].text)
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
