"""te_fast: Transformer Engine-style unfused attention on custom C++/CUDA ops (torch.library)."""

from te_fast import fp8, ops
from te_fast._loader import UNAVAILABLE_REASON, device_unavailable_reason, has_kernel
from te_fast.attention import UnfusedDotProductAttention

__all__ = [
    "UNAVAILABLE_REASON",
    "UnfusedDotProductAttention",
    "device_unavailable_reason",
    "fp8",
    "has_kernel",
    "ops",
]
