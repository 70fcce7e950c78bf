"""Attention cases: what a case is, the deterministic matrices, and how its inputs are built."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace

import torch

from te_ref.layouts import (
    ATTN_MASK_TYPES,  # noqa: F401  (re-exported for the suites)
    CONTRACT_LAYOUTS,
    LAYOUTS,
    PADDING_MASK_TYPES,
    parse_layout,
)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BIAS_SHAPES = ("bhss", "1hss", "b1ss", "11ss", "111s")


@dataclass(frozen=True)
class AttnCase:
    """One attention call, described by data only (no tensors)."""

    layout: str
    dtype: str
    mask_type: str
    device: str = "cuda"
    b: int = 2
    sq: int = 37
    skv: int = 37
    h: int = 4
    hg: int = 4
    d: int = 32
    dv: int = 32
    bias_type: str = "no_bias"
    bias_shape: str | None = None  # for pre/post_scale_bias
    alibi_slopes: str | None = None  # None (default slopes), "h" or "bh" for alibi
    softmax_type: str = "vanilla"
    offset_via: str = "arg"  # learnable: "arg" ([h] forward argument) or "param" (module owns it)
    window: tuple[int, int] | None = None
    bottom_right_diagonal: bool | None = None
    # padding types on sbhd/bshd: "cu_seqlens" | "mask" (right padding) | "mask_left"
    padding_from: str = "cu_seqlens"
    varlen: str = "random"  # lengths: "random" | "zero_length" | "full" | "trailing"
    kv_cache_extra: int = 0  # thd_2*: kv cache longer than any filled length by this much
    return_max_logit: bool = False
    default_scale: bool = False  # build with softmax_scale=None: the default dqk ** -0.5 applies
    scale_factor: float = 1.0  # softmax_scale = scale_factor * d ** -0.5 (softmax_scale below)
    tags: tuple[str, ...] = field(default=())

    @property
    def softmax_scale(self) -> float:
        """The softmax_scale the case is built with and judged at (with ``default_scale``, the
        one the implementation must derive: dqk ** -0.5)."""
        return self.scale_factor * self.d**-0.5

    @property
    def attention_type(self) -> str:
        return "self" if self.sq == self.skv else "cross"

    @property
    def layout_info(self):
        return parse_layout(self.layout)

    def invalid_reason(self) -> str | None:
        """Why this combination cannot be expressed at all (not an implementation limit)."""
        info = self.layout_info
        if info.packing == "qkv" and (
            self.h != self.hg or self.sq != self.skv or self.d != self.dv
        ):
            return (
                "qkv-packed layouts hold q, k, v in one buffer: no GQA/MQA, MLA or cross attention"
            )
        if info.packing == "kv" and self.d != self.dv:
            return "kv-packed layouts hold k and v in one buffer: dv must equal d (no MLA)"
        if info.q_format == "thd" and not self.mask_type.startswith("padding"):
            return "a thd q takes the padding mask types only (SPEC §1; an error case)"
        return None

    @property
    def id(self) -> str:
        parts = [self.layout, self.dtype, self.mask_type]
        if self.hg != self.h:
            parts.append("mqa" if self.hg == 1 else f"gqa{self.h // self.hg}")
        if self.dv != self.d:
            parts.append(f"mla{self.d}x{self.dv}")
        if self.h & (self.h - 1):  # no power of 2: ALiBi's default slopes take a second series
            parts.append(f"h{self.h}")
        if self.sq != self.skv:
            parts.append(f"cross{self.sq}x{self.skv}")
        elif self.sq == 1:
            parts.append("one_token")  # sq = skv = 1
        if self.bias_type != "no_bias":
            parts.append(self.bias_type + (f"_{self.bias_shape}" if self.bias_shape else ""))
            if self.alibi_slopes:
                parts.append(f"slopes_{self.alibi_slopes}")
        if self.softmax_type != "vanilla":
            parts.append(self.softmax_type + ("_param" if self.offset_via == "param" else ""))
        if self.window is not None:
            parts.append(f"win{self.window[0]}_{self.window[1]}")
        if self.bottom_right_diagonal is not None:
            parts.append("diag_br" if self.bottom_right_diagonal else "diag_tl")
        if self.mask_type.startswith("padding") and self.layout_info.q_format != "thd":
            parts.append(f"pad_{self.padding_from}")
        if self.layout_info.q_format == "thd" and self.varlen != "random":
            parts.append(self.varlen)
        if self.kv_cache_extra:
            parts.append(f"cache+{self.kv_cache_extra}")
        if self.return_max_logit:
            parts.append("max_logit")
        if self.default_scale:
            parts.append("scale_default")
        if self.scale_factor != 1.0:
            parts.append(f"scale{self.scale_factor:g}")
        parts.append(self.device)
        return "-".join(parts)

    def fields(self) -> dict:
        """What the report records about the case."""
        return {
            "layout": self.layout,
            "dtype": self.dtype,
            "mask_type": self.mask_type,
            "bias_type": self.bias_type,
            "softmax_type": self.softmax_type,
            "device": self.device,
            "shapes": {
                "b": self.b, "sq": self.sq, "skv": self.skv, "h": self.h, "hg": self.hg,
                "d": self.d, "dv": self.dv,
            },
        }  # fmt: skip


# ----------------------------------------------------------------------------- matrices

# Smaller problems on the CPU (CI has 2 cores); odd sizes everywhere.
SIZES = {
    "cpu": {"b": 2, "sq": 13, "skv": 13, "h": 4, "d": 16},
    "cuda": {"b": 3, "sq": 77, "skv": 77, "h": 8, "d": 64},
}
DEVICE_DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp16")}
CORE_MASKS = ("no_mask", "causal", "padding_causal", "causal_bottom_right")
# a thd q takes the padding types only (SPEC §1): its core masks
CORE_MASKS_THD = PADDING_MASK_TYPES


def sized(case: AttnCase, cross: bool = False, gqa: int = 1, mla: bool = False) -> AttnCase:
    s = SIZES[case.device]
    skv = s["skv"] + (s["skv"] // 2 + 3 if cross else 0)
    d = s["d"]
    return replace(
        case, b=s["b"], sq=s["sq"], skv=skv, h=s["h"], hg=s["h"] // gqa, d=d,
        dv=d // 2 + 8 if mla else d,
    )  # fmt: skip


def core_matrix(device: str) -> list[AttnCase]:
    """The 5 contract layouts x 2 dtypes x 4 masks x {MHA, GQA}, in full."""
    cases = []
    for layout, dtype, gqa in itertools.product(CONTRACT_LAYOUTS, DEVICE_DTYPES[device], (1, 2)):
        thd = LAYOUTS[layout].q_format == "thd"
        for mask in CORE_MASKS_THD if thd else CORE_MASKS:
            cases.append(sized(AttnCase(layout, dtype, mask, device=device), gqa=gqa))
    return cases


def alignment_matrix(device: str) -> list[AttnCase]:
    """Every mask type x bottom_right_diagonal (None, True, False) x shape (sq < skv, sq = skv,
    sq > skv, one query and one key), no window, on bshd in the device's first dtype.

    Why: the two causal alignments differ only when sq != skv (or with padding), and an
    implementation may take another path for each mask type and alignment (te_fast hands causal
    types without padding or window to its top-left or bottom-right causal kernel, and builds
    an explicit mask otherwise). The other matrices reached the kernels with sq != skv only by
    a random draw on the GPU; here every path meets every shape on every device.
    """
    s = SIZES[device]
    shapes = {
        "sq<skv": (s["sq"], s["skv"] + s["skv"] // 2 + 3),
        "sq=skv": (s["sq"], s["skv"]),
        "sq>skv": (s["sq"] + s["sq"] // 2 + 3, s["skv"]),
        "sq=skv=1": (1, 1),  # one query, one key: every kept probability is exactly 1
    }
    cases = []
    for mask, diagonal, (sq, skv) in itertools.product(
        ATTN_MASK_TYPES, (None, True, False), shapes.values()
    ):
        case = AttnCase("bshd_bshd_bshd", DEVICE_DTYPES[device][0], mask, device=device,
                        bottom_right_diagonal=diagonal)  # fmt: skip
        cases.append(replace(sized(case), sq=sq, skv=skv))
    return cases


def decode_matrix(device: str) -> list[AttnCase]:
    """Decoding, one query token against a longer key/value sequence (sq = 1 < skv): every mask
    type x bottom_right_diagonal (None, True, False) on bshd with GQA, the same with a sliding
    window for the types whose window alignment the override decides (no_mask, padding,
    arbitrary) and for the two causal types, and the padding types x the overrides on a thd q
    against a thd key/value batch and against a bshd kv cache longer than its filled lengths;
    the device's first dtype.

    Why: with one query the two alignments are furthest apart (te_ref: top-left causal keeps
    key 0 only, bottom-right keeps every key; a window sits at key 0 or at the last key), and
    implementations special-case one query token (a decode kernel, or dropping the causal flag
    for it); the alignment matrix met sq = 1 only with skv = 1, where both keep the one key.
    TE forces the causal types' alignment whatever bottom_right_diagonal says (SPEC §2): the
    causal cases with an override check that it is ignored.
    """
    s = SIZES[device]
    dtype = DEVICE_DTYPES[device][0]
    skv = s["skv"] + s["skv"] // 2 + 3
    cases = []
    windowed = [(mask, diagonal, (4, 1)) for mask, diagonal in itertools.product(
        ("no_mask", "padding", "arbitrary"), (None, True, False))]  # fmt: skip
    windowed += [(mask, None, (4, 0)) for mask in ("causal", "causal_bottom_right")]
    for mask, diagonal, window in [
        *((m, d, None) for m, d in itertools.product(ATTN_MASK_TYPES, (None, True, False))),
        *windowed,
    ]:
        case = AttnCase("bshd_bshd_bshd", dtype, mask, device=device, window=window,
                        bottom_right_diagonal=diagonal)  # fmt: skip
        cases.append(replace(sized(case, gqa=2), sq=1, skv=skv))
    for layout, mask, diagonal in itertools.product(
        ("thd_thd_thd", "thd_bshd_bshd"), CORE_MASKS_THD, (None, True, False)
    ):
        case = AttnCase(layout, dtype, mask, device=device, bottom_right_diagonal=diagonal,
                        kv_cache_extra=9 if layout == "thd_bshd_bshd" else 0)  # fmt: skip
        cases.append(replace(sized(case), sq=1, skv=skv))
    return cases


def alibi_matrix(device: str) -> list[AttnCase]:
    """ALiBi with default, per-head and per-batch-and-head slopes x a power-of-2 head count and 6
    heads x no mask and causal, on bshd in the device's first dtype.

    Why: TE's default slopes are a geometric series over the largest power of 2 below h, then
    every other term of the next series for the heads past it; with the matrices' power-of-2 head
    counts that second series never ran outside a random fuzz draw.
    """
    cases = []
    axes = ((None, "h", "bh"), (None, 6), ("no_mask", "causal"))
    for slopes, heads, mask in itertools.product(*axes):
        case = sized(AttnCase("bshd_bshd_bshd", DEVICE_DTYPES[device][0], mask, device=device,
                              bias_type="alibi", alibi_slopes=slopes))  # fmt: skip
        if heads is not None:
            case = replace(case, h=heads, hg=heads)
        if not case.invalid_reason():
            cases.append(case)
    return cases


def _axis_values(device: str):
    return {
        "layout": sorted(LAYOUTS),
        "dtype": DEVICE_DTYPES[device],
        "mask_type": list(ATTN_MASK_TYPES),
        "bias": [
            ("no_bias", None, None),
            *[("pre_scale_bias", s, None) for s in BIAS_SHAPES],
            *[("post_scale_bias", s, None) for s in BIAS_SHAPES],
            ("alibi", None, None),
            ("alibi", None, "h"),
            ("alibi", None, "bh"),
        ],
        "softmax": [
            ("vanilla", "arg"),
            ("off-by-one", "arg"),
            ("learnable", "arg"),
            ("learnable", "param"),
        ],  # fmt: skip
        # windows every mask type takes (SPEC §2.3): (3, 2) and (-1, -1) are coerced, with a
        # warning, to (3, 0) and (-1, 0) on the causal types
        "window": [None, (5, 0), (3, 2), (-1, -1), (0, 0)],
        "diagonal": [None, None, True, False],
        "shape": ["mha", "gqa", "mqa", "mla", "cross"],
        "padding_from": ["cu_seqlens", "mask", "mask_left"],
        "varlen": ["random", "zero_length", "full", "trailing"],
        "max_logit": [False, False, True],
    }


def _build(device: str, choice: dict) -> AttnCase | None:
    bias_type, bias_shape, slopes = choice["bias"]
    softmax_type, offset_via = choice["softmax"]
    shape = choice["shape"]
    case = AttnCase(
        choice["layout"], choice["dtype"], choice["mask_type"], device=device,
        bias_type=bias_type, bias_shape=bias_shape, alibi_slopes=slopes,
        softmax_type=softmax_type, offset_via=offset_via, window=choice["window"],
        bottom_right_diagonal=choice["diagonal"], padding_from=choice["padding_from"],
        varlen=choice["varlen"], return_max_logit=choice["max_logit"],
    )  # fmt: skip
    case = sized(
        case, cross=shape == "cross", gqa={"gqa": 2, "mqa": 4}.get(shape, 1), mla=shape == "mla"
    )
    info = case.layout_info
    if info.q_format != info.kv_format and info.q_format == "thd":
        case = replace(case, kv_cache_extra=7, skv=case.sq)  # cache longer than filled lengths
    if case.invalid_reason():
        return None
    return case


def broad_matrix(device: str, count: int, seed: int = 20261202) -> list[AttnCase]:
    """A deterministic sample of every layout, mask, bias, softmax type, window and shape.

    Every value of every axis appears at least once (chosen first), the rest are random
    combinations; invalid combinations are redrawn. The same seed gives the same cases.
    """
    axes = _axis_values(device)
    rng = random.Random(seed)
    cases: dict[str, AttnCase] = {}

    def draw(fixed: dict) -> None:
        for _ in range(200):
            choice = {k: (fixed[k] if k in fixed else rng.choice(v)) for k, v in axes.items()}
            case = _build(device, choice)
            if case is not None and case.id not in cases:
                cases[case.id] = case
                return

    for axis, values in axes.items():
        for value in values:
            draw({axis: value})
    while len(cases) < count:
        draw({})
    return list(cases.values())


def thd_inference_cases(device: str) -> list[AttnCase]:
    """q in thd with a padded kv cache (longer than its filled lengths), bottom-right causal."""
    out = []
    for layout, dtype, gqa, varlen in itertools.product(
        ("thd_bshd_bshd", "thd_sbhd_sbhd"), DEVICE_DTYPES[device], (1, 2), ("random", "zero_length")
    ):
        case = AttnCase(layout, dtype, "padding_causal_bottom_right", device=device, varlen=varlen)
        case = sized(case, gqa=gqa)
        out.append(replace(case, kv_cache_extra=9))
    return out


def default_scale_cases(device: str) -> list[AttnCase]:
    """softmax_scale=None, where the default dqk ** -0.5 must come from the query/key head dim:
    MLA (dv != dqk on every device), also with GQA and cross attention, and ragged."""
    out = []
    for layout, mask, gqa, cross in (
        ("bshd_bshd_bshd", "causal", 1, False),
        ("sbhd_sbhd_sbhd", "no_mask", 2, True),
        ("thd_thd_thd", "padding_causal", 1, False),
    ):
        for dtype in DEVICE_DTYPES[device]:
            case = AttnCase(layout, dtype, mask, device=device, default_scale=True)
            case = sized(case, cross=cross, gqa=gqa)
            out.append(replace(case, dv=case.d // 2 + 3))
    return out


# Factors of the softmax scale off the default d ** -0.5 (one under, one over 1).
SCALE_FACTORS = (0.37, 2.9)


def scale_cases(device: str) -> list[AttnCase]:
    """softmax_scale other than d ** -0.5, with every bias and softmax type it meets: no bias
    (causal), pre- and post-scale bias, ALiBi with its default and per-head slopes, and the
    sinks (learnable, causal and unmasked; off-by-one unmasked), on bshd in the device's first
    dtype. Every other unmasked sink case carries a post-scale bias, after which the softmax's
    own scale is 1.

    Why: every other case is built at d ** -0.5, te_fast's default, so a path that drops or
    misplaces the scale (ALiBi's bias added before it, a bias scaled twice) passed them all; a
    q of 0 in the literal ALiBi pins makes the scale moot there too.
    """
    out = []
    kinds = (("causal", "no_bias", None, None, "vanilla"),
             ("causal", "pre_scale_bias", "1hss", None, "vanilla"),
             ("causal", "post_scale_bias", "b1ss", None, "vanilla"),
             ("causal", "alibi", None, None, "vanilla"), ("causal", "alibi", None, "h", "vanilla"),
             ("causal", "no_bias", None, None, "learnable"),
             ("no_mask", "no_bias", None, None, "learnable"),
             ("no_mask", "no_bias", None, None, "off-by-one"))  # fmt: skip
    for factor in SCALE_FACTORS:
        for mask, bias, shape, slopes, softmax in kinds:
            case = AttnCase("bshd_bshd_bshd", DEVICE_DTYPES[device][0], mask, device=device,
                            bias_type=bias, bias_shape=shape, alibi_slopes=slopes,
                            softmax_type=softmax, scale_factor=factor)  # fmt: skip
            out.append(sized(case))
    return out


def max_logit_cases(device: str) -> list[AttnCase]:
    """return_max_logit with the causal mask types an implementation may run as a kernel (no
    padding, bias or window: te_fast's causal softmax kernels), square and cross, every dtype
    of the device. Why: on the CPU only one compiled case combined them (test_compile's), so a
    max_logit taken over the masked-out scores of the kernel path had one eager-less witness."""
    out = []
    for mask, cross, dtype in itertools.product(
        ("causal", "causal_bottom_right"), (False, True), DEVICE_DTYPES[device]
    ):
        case = AttnCase("bshd_bshd_bshd", dtype, mask, device=device, return_max_logit=True)
        out.append(sized(case, cross=cross))
    return out


def varlen_cases(device: str) -> list[AttnCase]:
    """Ragged batches: random lengths, zero-length sequences, one full sequence, trailing tokens."""
    out = []
    for layout, varlen, mask in itertools.product(
        ("thd_thd_thd", "t3hd", "thd_th2d"),
        ("random", "zero_length", "full", "trailing"),
        ("padding", "padding_causal", "padding_causal_bottom_right"),  # thd: padding types only
    ):
        case = AttnCase(layout, DEVICE_DTYPES[device][-1], mask, device=device, varlen=varlen)
        out.append(sized(case))
    return out


# ----------------------------------------------------------------------------- inputs


def _lengths(case: AttnCase, s: int, rng: torch.Generator) -> list[int]:
    if case.varlen == "full" or not (
        case.mask_type.startswith("padding") or case.layout_info.q_format == "thd"
    ):
        return [s] * case.b
    lengths = torch.randint(1, s + 1, (case.b,), generator=rng).tolist()
    if case.varlen == "zero_length" and case.b > 1:
        lengths[1] = 0
    if case.varlen == "full":
        lengths[0] = s
    return lengths


def _cu(lengths, device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


@dataclass
class AttnInputs:
    """Leaf tensors (the ones gradients are taken for) and everything else a call needs."""

    leaves: dict[str, torch.Tensor]  # name -> leaf (packed buffers stay whole)
    kwargs: dict  # forward keyword arguments except tensors derived from leaves
    grad_out: torch.Tensor
    lengths_q: list[int]
    lengths_kv: list[int]

    def with_fresh_values(self, rng: torch.Generator) -> AttnInputs:
        """Same shapes, lengths, masks and cu_seqlens; new random leaf values and dO."""

        def fresh(t):
            return torch.randn(t.shape, generator=rng).to(device=t.device, dtype=t.dtype)

        leaves = {n: fresh(t) for n, t in self.leaves.items()}
        return AttnInputs(
            leaves, self.kwargs, fresh(self.grad_out), self.lengths_q, self.lengths_kv
        )

    def views(self, leaves: dict[str, torch.Tensor], case: AttnCase):
        """(q, k, v, extra kwargs) as strided views of ``leaves`` (same recipe for every copy)."""
        info = case.layout_info
        if info.packing == "qkv":
            buf = leaves["qkv"]
            q, k, v = (buf.select(info.pack_dim, i) for i in range(3))
        else:
            q = leaves["q"]
            if info.packing == "kv":
                k, v = (leaves["kv"].select(info.pack_dim, i) for i in range(2))
            else:
                k, v = leaves["k"], leaves["v"]
        extra = {}
        if "bias" in leaves:
            extra["core_attention_bias"] = leaves["bias"]
        if "offset" in leaves:
            extra["softmax_offset"] = leaves["offset"]
        return q, k, v, extra


def make_inputs(case: AttnCase, device: torch.device, rng: torch.Generator) -> AttnInputs:
    """Random inputs for a case (on ``device``), with packed layouts as views of one buffer.

    The steps draw from ``rng`` in a fixed order (lengths, q/k/v, arbitrary mask, bias, alibi
    slopes, softmax offset, dO): the same case and generator give bit-identical inputs.
    """
    dtype = DTYPES[case.dtype]

    def randn(*shape):
        return torch.randn(shape, generator=rng, device="cpu").to(device=device, dtype=dtype)

    lq, lkv = _sequence_lengths(case, rng)
    trailing = 3 if case.varlen == "trailing" else 0  # tokens past cu_seqlens[-1]
    t_q, t_kv = sum(lq) + trailing, sum(lkv) + trailing
    leaves = _qkv_leaves(case, t_q, t_kv, randn)
    kwargs = _call_kwargs(case, lq, lkv, device, rng)
    if case.bias_type in ("pre_scale_bias", "post_scale_bias"):
        leaves["bias"] = randn(*_bias_shape(case))
    if case.bias_type == "alibi" and case.alibi_slopes:
        kwargs["alibi_slopes"] = _alibi_slopes(case, device, rng)
    if case.softmax_type == "learnable":
        leaves["offset"] = torch.randn(case.h, generator=rng).to(device)  # fp32, like TE
    grad_out = randn(*_output_shape(case, t_q))
    return AttnInputs(leaves, kwargs, grad_out, lq, lkv)


def _skv_buffer(case: AttnCase) -> int:
    """The kv length of the k/v tensors: skv, plus the unfilled tail of a thd_2* kv cache."""
    return case.skv + case.kv_cache_extra


def _sequence_lengths(case: AttnCase, rng: torch.Generator) -> tuple[list[int], list[int]]:
    """Per-batch lengths of q and kv: a kv cache is filled at least as far as its queries;
    self attention with one mask or one qkv buffer shares the query lengths."""
    info = case.layout_info
    lq = _lengths(case, case.sq, rng)
    if info.q_format == "thd" and info.kv_format != "thd":  # kv cache: filled >= query lengths
        lkv = [n + int(torch.randint(0, 4, (1,), generator=rng)) for n in lq]
        lkv = [min(n, _skv_buffer(case)) for n in lkv]
    elif case.sq == case.skv and (info.packing == "qkv" or case.padding_from != "cu_seqlens"):
        lkv = list(lq)
    else:
        lkv = _lengths(case, case.skv, rng)
    return lq, lkv


def _seq_shape(fmt: str, b: int, s: int, t: int) -> tuple[int, ...]:
    return {"sbhd": (s, b), "bshd": (b, s), "thd": (t,)}[fmt]


def _qkv_leaves(case: AttnCase, t_q: int, t_kv: int, randn) -> dict[str, torch.Tensor]:
    """q, k, v as leaves: one "qkv" buffer, "q" and one "kv" buffer, or "q", "k", "v"."""
    info = case.layout_info
    q_seq = _seq_shape(info.q_format, case.b, case.sq, t_q)
    kv_seq = _seq_shape(info.kv_format, case.b, _skv_buffer(case), t_kv)
    if info.packing == "qkv":
        shape = (*q_seq, 3, case.h, case.d) if info.pack_dim == -3 else (*q_seq, case.h, 3, case.d)
        return {"qkv": randn(*shape)}
    leaves = {"q": randn(*q_seq, case.h, case.d)}
    if info.packing == "kv":
        if info.pack_dim == -3:
            leaves["kv"] = randn(*kv_seq, 2, case.hg, case.d)
        else:
            leaves["kv"] = randn(*kv_seq, case.hg, 2, case.d)
    else:
        leaves["k"] = randn(*kv_seq, case.hg, case.d)
        leaves["v"] = randn(*kv_seq, case.hg, case.dv)
    return leaves


def _call_kwargs(case: AttnCase, lq, lkv, device, rng: torch.Generator) -> dict:
    """The forward keyword arguments that are no leaves: layout, mask type, sequence lengths
    (cu_seqlens or a padding mask), an arbitrary mask, window, alignment and bias type."""
    info = case.layout_info
    skv_buf = _skv_buffer(case)
    kwargs: dict = {"qkv_layout": case.layout, "attn_mask_type": case.mask_type}
    padded = case.mask_type.startswith("padding")
    if info.q_format == "thd":
        kwargs.update(cu_seqlens_q=_cu(lq, device), max_seqlen_q=case.sq)
        if info.kv_format == "thd":
            kwargs.update(cu_seqlens_kv=_cu(lkv, device), max_seqlen_kv=case.skv)
        else:
            kwargs.update(cu_seqlens_kv=_cu(lkv, device))
    elif padded and case.padding_from == "cu_seqlens":
        kwargs.update(cu_seqlens_q=_cu(lq, device), cu_seqlens_kv=_cu(lkv, device))
    elif padded:
        left = case.padding_from == "mask_left"
        mq = _padding_mask(lq, case.sq, device, left)
        mkv = _padding_mask(lkv, skv_buf, device, left)
        kwargs["attention_mask"] = mq if case.sq == skv_buf else (mq, mkv)
    if case.mask_type == "arbitrary":
        shape = (case.b, case.h, case.sq, skv_buf)
        mask = torch.rand(shape, generator=rng).to(device) < 0.3
        if case.sq > 1:
            mask[:, :, 1] = True  # fully masked rows must come out as 0
        kwargs["attention_mask"] = mask
    if case.window is not None:
        kwargs["window_size"] = case.window
    if case.bottom_right_diagonal is not None:
        kwargs["bottom_right_diagonal"] = case.bottom_right_diagonal
    if case.bias_type != "no_bias":
        kwargs["core_attention_bias_type"] = case.bias_type
    return kwargs


def _padding_mask(lengths: list[int], s: int, device, left: bool = False) -> torch.Tensor:
    """[b, 1, 1, s] bool, True = padding: the positions past each sequence's length, or (left)
    the positions before its last `length`."""
    ar = torch.arange(s, device=device)
    n = torch.tensor(lengths, device=device)[:, None]
    pad = ar[None, :] < s - n if left else ar[None, :] >= n
    return pad.view(len(lengths), 1, 1, -1)


def _bias_shape(case: AttnCase) -> tuple[int, ...]:
    skv_buf = _skv_buffer(case)
    return {
        "bhss": (case.b, case.h, case.sq, skv_buf), "1hss": (1, case.h, case.sq, skv_buf),
        "b1ss": (case.b, 1, case.sq, skv_buf), "11ss": (1, 1, case.sq, skv_buf),
        "111s": (1, 1, 1, skv_buf),
    }[case.bias_shape]  # fmt: skip


def _alibi_slopes(case: AttnCase, device, rng: torch.Generator) -> torch.Tensor:
    """User slopes [h] or [b, h], fp32 in [0.05, 0.55)."""
    shape = (case.h,) if case.alibi_slopes == "h" else (case.b, case.h)
    return torch.rand(shape, generator=rng).to(device) * 0.5 + 0.05


def _output_shape(case: AttnCase, t_q: int) -> tuple[int, ...]:
    """The output's shape by the SPEC §1 rules (dO is built before any implementation runs)."""
    q_format = case.layout_info.q_format
    if q_format == "sbhd":
        return (case.sq, case.b, case.h * case.dv)
    if q_format == "bshd":
        return (case.b, case.sq, case.h * case.dv)
    return (t_q, case.h * case.dv)


# ----------------------------------------------------------------------------- for adapters


def fully_masked_rows(case: AttnCase) -> int:
    """How many rows of real (unpadded) queries, per head, have no key left to attend to (SPEC
    §2.4: their output is exactly 0) in the inputs the eager suites judge ``case`` on
    (suites/checks/attention.py prepare: make_inputs with a generator seeded from the case id;
    the suites of test_attention.py). For a declared difference's predicate (docs/adapters.md
    #declared-differences): a padded or masked pattern decides it, and the lengths are drawn,
    so the case's fields alone do not tell. The mask is te_ref's (te_ref.attention.build_mask)."""
    import zlib

    from te_ref.attention import build_mask
    from te_ref.config import resolve

    cpu = torch.device("cpu")
    inputs = make_inputs(case, cpu, torch.Generator().manual_seed(zlib.crc32(case.id.encode())))
    q, k, v, extra = inputs.views(inputs.leaves, case)
    call = resolve(q, k, v, softmax_type=case.softmax_type, attention_type=case.attention_type,
                   **inputs.kwargs, **extra)  # fmt: skip
    full = build_mask(call, cpu).all(dim=-1)  # (b, h|1, sq): nothing to attend to
    mask = inputs.kwargs.get("attention_mask")
    if case.mask_type.startswith("padding") and isinstance(mask, (torch.Tensor, tuple, list)):
        mask_q = mask[0] if isinstance(mask, (tuple, list)) else mask
        real_q = ~mask_q[:, 0, 0, :]  # (b, sq), any pattern (left padding too)
    else:  # the first lengths_q[x] positions of each element (all of them without padding)
        real_q = torch.arange(case.sq)[None, :] < torch.tensor(inputs.lengths_q)[:, None]
    return int((full & real_q[:, None, :]).sum())


# The module matrices the conformance suite runs (suites/conformance/test_attention.py's
# @pytest.mark.matrix(name)); te_fast's eager core is judged on the same (suites/te_fast/
# test_dispatch_paths.py). The broad sample is larger on CUDA.
BROAD_COUNT = {"cpu": 60, "cuda": 160}
MODULE_MATRICES = {
    "core": core_matrix,
    "broad": lambda dev: broad_matrix(dev, BROAD_COUNT[dev]),
    "thd_inference": thd_inference_cases,
    "varlen": varlen_cases,
    "alignment": alignment_matrix,
    "decode": decode_matrix,
    "default_scale": default_scale_cases,
    "scale": scale_cases,
    "max_logit": max_logit_cases,
    "alibi": alibi_matrix,
}
