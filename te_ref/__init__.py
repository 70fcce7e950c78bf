"""te_ref: the readable float64 reference of Transformer Engine-style unfused attention."""

from te_ref.attention import default_alibi_slopes, dot_product_attention
from te_ref.layouts import CONTRACT_LAYOUTS, LAYOUTS, parse_layout
from te_ref.ops import (
    convert_bshd_to_thd,
    convert_thd_to_bshd,
    kept_columns,
    scaled_aligned_causal_masked_softmax,
    scaled_aligned_causal_masked_softmax_bwd,
    scaled_masked_softmax,
    scaled_masked_softmax_bwd,
    scaled_softmax,
    scaled_softmax_bwd,
    scaled_upper_triang_masked_softmax,
    scaled_upper_triang_masked_softmax_bwd,
    softmax_backward,
)

__all__ = [
    "CONTRACT_LAYOUTS",
    "LAYOUTS",
    "convert_bshd_to_thd",
    "convert_thd_to_bshd",
    "default_alibi_slopes",
    "dot_product_attention",
    "kept_columns",
    "parse_layout",
    "scaled_aligned_causal_masked_softmax",
    "scaled_aligned_causal_masked_softmax_bwd",
    "scaled_masked_softmax",
    "scaled_masked_softmax_bwd",
    "scaled_softmax",
    "scaled_softmax_bwd",
    "scaled_upper_triang_masked_softmax",
    "scaled_upper_triang_masked_softmax_bwd",
    "softmax_backward",
]
