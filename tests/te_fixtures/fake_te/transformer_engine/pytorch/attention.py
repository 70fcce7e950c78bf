"""A recording DotProductAttention with TE 2.18's constructor and forward signatures.

Every call appends {"init": kwargs} or {"forward": kwargs, "qkv": (q, k, v), "fp8_recipe": ...}
to CALLS, with the keyword arguments exactly as passed. Like TE it rejects unknown arguments
(TypeError) and asserts the preconditions its own source asserts (mask type names, thd only with
padding types, check_set_window_size, head counts, alibi arguments). Its output has TE's shape
and is zero.
"""

import inspect
import os

import torch

CALLS: list[dict] = []
FP8 = {"recipe": None}
# TE's backend cache (dot_product_attention._attention_backends): the adapter reads it.
_attention_backends = {"use_flash_attention": None, "use_fused_attention": None,
                       "use_unfused_attention": None}  # fmt: skip
MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right", "arbitrary")  # fmt: skip


def _init(self, num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0,
          qkv_format="sbhd", attn_mask_type="causal", window_size=None,
          bottom_right_diagonal=None, sequence_parallel=False, tp_size=1,
          get_rng_state_tracker=None, tp_group=None, layer_number=None, attention_type="self",
          cp_group=None, cp_global_ranks=None, cp_stream=None, cp_comm_type="p2p",
          softmax_scale=None, softmax_type="vanilla", return_max_logit=False,
          name=None): ...  # fmt: skip


def _forward(self, query_layer=None, key_layer=None, value_layer=None, attention_mask=None,
             qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
             cu_seqlens_kv_padded=None, max_seqlen_q=None, max_seqlen_kv=None,
             attn_mask_type=None, window_size=None, bottom_right_diagonal=None,
             checkpoint_core_attention=False, core_attention_bias_type="no_bias",
             core_attention_bias=None, alibi_slopes=None, fast_zero_fill=True,
             inference_params=None, pad_between_seqs=None, fp8_output=False,
             num_splits=1): ...  # fmt: skip


def drop_arguments(*names: str) -> None:
    """Make the stand-in an older TE: its signatures lose ``names``."""
    for fn in (DotProductAttention.__init__, DotProductAttention.forward):
        sig = inspect.signature(fn)
        fn.__signature__ = sig.replace(
            parameters=[p for p in sig.parameters.values() if p.name not in names]
        )


def check_set_window_size(attn_mask_type, window_size):
    """TE's rule (dot_product_attention/utils.py), asserting where TE asserts."""
    if "causal" in attn_mask_type:
        if window_size is None:
            return (-1, 0)
        assert window_size == (-1, 0) or (window_size[0] >= 0 and window_size[1] == 0), (
            f"window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={attn_mask_type}"
        )
        return window_size
    assert attn_mask_type in ("no_mask", "padding", "arbitrary"), attn_mask_type
    if window_size is None:
        return (-1, -1)
    assert window_size == (-1, -1) or (window_size[0] >= 0 and window_size[1] >= 0), (
        f"window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={attn_mask_type}"
    )
    return window_size


class DotProductAttention(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        a = inspect.signature(DotProductAttention.__init__).bind(self, *args, **kwargs)
        a.apply_defaults()
        a = a.arguments
        super().__init__()
        CALLS.append({"init": dict(kwargs)})
        assert a["attn_mask_type"] in MASK_TYPES, a["attn_mask_type"]
        check_set_window_size(a["attn_mask_type"], a["window_size"])
        h = a["num_attention_heads"]
        self.num_gqa_groups = h if a["num_gqa_groups"] is None else a["num_gqa_groups"]
        assert h % self.num_gqa_groups == 0
        assert a["attention_type"] in ("self", "cross")
        kv = a["kv_channels"]
        self.dqk, self.dv = (kv, kv) if isinstance(kv, int) else kv
        self.return_max_logit = a.get("return_max_logit", False)  # TE 2.9+
        self.softmax_type = a.get("softmax_type", "vanilla")  # TE 2.8+
        if self.softmax_type == "learnable":
            self.softmax_offset = torch.nn.Parameter(torch.zeros(h))

    def forward(self, *args, **kwargs):
        a = inspect.signature(DotProductAttention.forward).bind(self, *args, **kwargs)
        a.apply_defaults()
        a = a.arguments
        q, k, v = a["query_layer"], a["key_layer"], a["value_layer"]
        CALLS.append({"forward": dict(kwargs), "qkv": (q, k, v), "fp8_recipe": FP8["recipe"]})
        fmt, mask_type = a["qkv_format"], a["attn_mask_type"]
        assert fmt in ("sbhd", "bshd", "thd"), fmt
        assert mask_type in MASK_TYPES, mask_type
        check_set_window_size(mask_type, a["window_size"])
        assert q.shape[-1] == k.shape[-1] == self.dqk and v.shape[-1] == self.dv
        assert k.shape[-2] == v.shape[-2] == self.num_gqa_groups
        if fmt == "thd":
            assert "padding" in mask_type, "Attention mask type must be padding for thd"
            cu_q, cu_kv = a["cu_seqlens_q"], a["cu_seqlens_kv"]
            assert cu_q is not None and cu_kv is not None and cu_q.shape == cu_kv.shape
            assert cu_q.dtype == cu_kv.dtype == torch.int32
        elif "padding" in mask_type and a["cu_seqlens_q"] is None:
            assert a["attention_mask"] is not None, "Please provide attention_mask for padding!"
        if a["alibi_slopes"] is not None:
            assert a["core_attention_bias_type"] == "alibi"
        if a["core_attention_bias_type"] == "alibi":
            assert a["core_attention_bias"] is None
        unfused = all(os.environ.get(f"NVTE_{b}_ATTN") == "0" for b in ("FLASH", "FUSED"))
        _attention_backends.update(use_unfused_attention=unfused, use_fused_attention=not unfused)
        h = q.shape[-2]
        lead = {"sbhd": q.shape[:2], "bshd": q.shape[:2], "thd": q.shape[:1]}[fmt]
        out = q.new_zeros(*lead, h * self.dv) + 0 * (q.sum() + k.sum() + v.sum())
        if self.return_max_logit:
            return out, torch.zeros(h)
        return out


DotProductAttention.__init__.__signature__ = inspect.signature(_init)
DotProductAttention.forward.__signature__ = inspect.signature(_forward)
