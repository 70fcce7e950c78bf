"""The qkv_layout names of SPEC §1 and what each one means (formats and packing)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """One qkv_layout: the format of q and of k/v, and how the buffers are packed."""

    name: str
    q_format: str  # "sbhd" | "bshd" | "thd"
    kv_format: str
    packing: str | None  # None (separate tensors), "qkv" (one buffer) or "kv" (k and v share one)
    pack_dim: int | None  # -3 ("3"/"2" before h: sb3hd) or -2 ("3"/"2" before d: sbh3d)

    @property
    def qkv_format(self) -> str:
        """TE's qkv_format: "sbhd", "bshd", "thd", or "<q>_2<kv>" for the inference layouts."""
        if self.q_format == self.kv_format:
            return self.q_format
        return f"{self.q_format}_2{self.kv_format}"


def _family(fmt: str, three: str, three_d: str, two: str, two_d: str) -> list[Layout]:
    return [
        Layout(three, fmt, fmt, "qkv", -3),
        Layout(three_d, fmt, fmt, "qkv", -2),
        Layout(f"{fmt}_{two}", fmt, fmt, "kv", -3),
        Layout(f"{fmt}_{two_d}", fmt, fmt, "kv", -2),
        Layout(f"{fmt}_{fmt}_{fmt}", fmt, fmt, None, None),
    ]


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        _family("sbhd", "sb3hd", "sbh3d", "sb2hd", "sbh2d")
        + _family("bshd", "bs3hd", "bsh3d", "bs2hd", "bsh2d")
        + _family("thd", "t3hd", "th3d", "t2hd", "th2d")
        + [
            Layout("sbhd_bshd_bshd", "sbhd", "bshd", None, None),
            Layout("bshd_sbhd_sbhd", "bshd", "sbhd", None, None),
            Layout("thd_bshd_bshd", "thd", "bshd", None, None),
            Layout("thd_sbhd_sbhd", "thd", "sbhd", None, None),
        ]
    )
}

# The layouts whose torch.compile / CUDA-graph behaviour is part of the contract (SPEC §1).
CONTRACT_LAYOUTS = ("bshd_bshd_bshd", "sbhd_sbhd_sbhd", "thd_thd_thd", "bs3hd", "sbh3d")

ATTN_MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)

# The mask types by what they hold (SPEC §2.3): the causal band (top-left or bottom-right
# aligned by their name), and the sequence lengths (padding)
CAUSAL_MASK_TYPES = (
    "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
)  # fmt: skip
TOP_LEFT_MASK_TYPES = ("causal", "padding_causal")
BOTTOM_RIGHT_MASK_TYPES = ("causal_bottom_right", "padding_causal_bottom_right")
PADDING_MASK_TYPES = ("padding", "padding_causal", "padding_causal_bottom_right")

BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")


def parse_layout(qkv_layout: str) -> Layout:
    """The Layout for a qkv_layout string; ValueError naming the valid ones otherwise."""
    try:
        return LAYOUTS[qkv_layout]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown qkv_layout {qkv_layout!r}; expected one of {sorted(LAYOUTS)}"
        ) from None
