"""The te-conformance adapter for my_attention: what it supports, and how the suites call it.

Registered through the entry point group `te_conformance.adapters` (this package's
pyproject.toml), so that `pytest --pyargs te_conformance.suites --impl my_attention` and
`python -m te_conformance run --impl my_attention` find it. The contract: docs/adapters.md of
te-conformance.
"""

from __future__ import annotations

import torch

from my_attention import attention
from te_conformance.suites.adapters.base import Adapter, Support


class MyAttentionAdapter(Adapter):
    """my_attention.attention behind TE's DotProductAttention forward arguments."""

    name = "my_attention"  # what --impl selects; equal to the entry point's name
    support = Support(
        layouts=("bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bs3hd", "bsh3d", "sb3hd", "sbh3d",
                 "bshd_bs2hd", "bshd_bsh2d", "sbhd_sb2hd", "sbhd_sbh2d"),
        mask_types=("no_mask", "causal", "causal_bottom_right", "arbitrary"),
        bias_types=("no_bias",),
        softmax_types=("vanilla",),
        outputs=(),  # the output only
        arguments=(),  # no window, no alignment override, no lengths
        why={
            "thd_thd_thd": "my_attention has no variable-length (thd) path",
            **dict.fromkeys(
                ("padding", "padding_causal", "padding_causal_bottom_right"),
                "my_attention takes no sequence lengths",
            ),
            "bottom_right_diagonal": "the alignment follows the mask type only",
            "window_size": "my_attention has no sliding window",
            "max_logit": "my_attention returns the output only",
        },
    )  # fmt: skip

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        if dropout or dropout_ctx is not None:
            raise NotImplementedError(self.declines(needs=("dropout",))[0].text)
        return _Module(scale)


class _Module(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v, *, qkv_layout, attn_mask_type, attention_mask=None):
        sbhd = qkv_layout.startswith("sb")

        def heads_first(t):  # -> (b, h, s, d)
            return t.permute(1, 2, 0, 3) if sbhd else t.permute(0, 2, 1, 3)

        out = attention(
            heads_first(q), heads_first(k), heads_first(v), scale=self.scale,
            causal=attn_mask_type in ("causal", "causal_bottom_right"),
            bottom_right=attn_mask_type == "causal_bottom_right", mask=attention_mask,
        )  # fmt: skip
        b, h, sq, dv = out.shape
        if sbhd:
            return out.permute(2, 0, 1, 3).reshape(sq, b, h * dv)  # (sq, b, h*dv)
        return out.permute(0, 2, 1, 3).reshape(b, sq, h * dv)  # (b, sq, h*dv)
