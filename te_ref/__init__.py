"""te_ref: the readable float64 reference of Transformer Engine-style unfused attention."""

from te_ref.attention import default_alibi_slopes, dot_product_attention
from te_ref.layouts import CONTRACT_LAYOUTS, LAYOUTS, parse_layout
from te_ref.ops import (
    convert_bshd_to_thd,
    convert_thd_to_bshd,
    scaled_aligned_causal_masked_softmax,
    scaled_masked_softmax,
    scaled_softmax,
    scaled_upper_triang_masked_softmax,
)

__all__ = [
    "CONTRACT_LAYOUTS",
    "LAYOUTS",
    "convert_bshd_to_thd",
    "convert_thd_to_bshd",
    "default_alibi_slopes",
    "dot_product_attention",
    "parse_layout",
    "scaled_aligned_causal_masked_softmax",
    "scaled_masked_softmax",
    "scaled_softmax",
    "scaled_upper_triang_masked_softmax",
]
