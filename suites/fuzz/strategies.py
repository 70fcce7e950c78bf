"""hypothesis strategies for the examples of suites/fuzz/checks.py, the settings profiles, and
`fuzz()`, which runs one check over drawn examples. Import only after
`pytest.importorskip("hypothesis")`.

Profiles, chosen with hypothesis' own `pytest --hypothesis-profile NAME` (registered by
suites/fuzz/profiles.py; TE_FUZZ_EXAMPLES=N overrides the count):
  ci       the default: a fixed seed (derandomize) and a small budget per device, so that CI
           (2 cores, CPU) spends about a minute in all fuzz tests together
  gpu      a fixed seed and several times the examples, for a GPU machine
  explore  a random seed each run and many examples, with hypothesis' example database, to
           hunt for new failures locally
"""

from __future__ import annotations

import contextlib
import os
import zlib
from dataclasses import replace

import hypothesis
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from te_conformance.reports import record
from te_conformance.suites.cases import BIAS_SHAPES, AttnCase
from te_conformance.suites.fuzz.checks import (
    CORRUPTIONS,
    LAYOUTS,
    ConvertExample,
    ModuleExample,
    SoftmaxExample,
)
from te_conformance.suites.fuzz.profiles import PROFILES, profile_name
from te_conformance.suites.op_cases import CONVERT_DTYPES, SOFTMAX_DTYPES
from te_ref.layouts import ATTN_MASK_TYPES, parse_layout
from te_ref.layouts import LAYOUTS as QKV_LAYOUTS

EXAMPLES_ENV = "TE_FUZZ_EXAMPLES"


def examples(device: str, kind: str) -> int:
    if os.environ.get(EXAMPLES_ENV):
        return int(os.environ[EXAMPLES_ENV])
    return PROFILES[profile_name()][device][kind]


def record_run(what: str, device_name: str, kind: str, impl: str = "te_fast") -> int:
    """Record what a fuzz test draws (its kind, device, profile and count) for the report; the
    number of examples. The count is also the case's ``fuzz_examples``, which the report tool
    compares with the baseline's: a run that draws fewer has lost coverage."""
    n = examples(device_name, kind)
    record.case(impl=impl, layout=f"fuzz:{what}", device=device_name,
                mask_type=f"{profile_name()}:{n}", fuzz_examples=n)  # fmt: skip
    return n


def fuzz_settings(max_examples: int, shrink: bool = True) -> settings:
    """The loaded profile's settings (seed, database, health checks) with this test's count."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if shrink:
        phases += [Phase.shrink, Phase.explain]
    return settings(settings.get_profile(profile_name()), max_examples=max_examples, phases=phases)


def seed_of(key: str) -> int:
    """The draws' seed for a test: a hash of its key (the test's id), nothing else."""
    return zlib.crc32(key.encode())


@contextlib.contextmanager
def pinned_constants():
    """Hypothesis draws a share of its integers and floats from the constants it finds in the
    source of every local module imported so far (hypothesis.internal.conjecture.providers,
    _get_local_constants), so the same seed drew other examples after another import or a
    change to any project file. Inside this context that pool is empty: the draws follow the
    seed alone. (Hypothesis' own global constants stay; they are fixed per release.)"""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # a hypothesis without the module: nothing to pin
        yield
        return
    local = getattr(providers, "_get_local_constants", None)
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    constants = getattr(providers, "Constants", None)
    if local is None or cache is None or constants is None:  # no local constants to pin
        yield
        return
    empty = constants()
    providers._get_local_constants = lambda: empty
    cache.clear()  # (global, local) pools per constraint, cached with the local ones in
    try:
        yield
    finally:
        providers._get_local_constants = local
        cache.clear()


def fuzz(
    check,
    strategy,
    device: str,
    max_examples: int,
    shrink: bool = True,
    explicit=(),
    key: str | None = None,
    **extra,
) -> None:
    """Run check(example, device, **extra) on the ``explicit`` examples, then on drawn ones; the
    first failure is shrunk and re-raised with hypothesis' "Falsifying example" and the
    example's reproducer in its notes.

    The draws are reproducible whatever else was imported: under a derandomized profile (ci,
    gpu) the seed is seed_of(key) (the test's id; without a key, hypothesis' hash of the runner's
    source), and hypothesis' pool of constants from the loaded modules is empty
    (pinned_constants). No global random state is read."""

    @fuzz_settings(max_examples, shrink)
    @given(example=strategy)
    def run(example):
        check(example, device, **extra)

    for ex in explicit:
        run = hypothesis.example(example=ex)(run)
    if key is not None and settings.get_profile(profile_name()).derandomize:
        run = hypothesis.seed(seed_of(key))(run)
    with pinned_constants():
        run()


# ----------------------------------------------------------------------------- softmax ops

# Row lengths at the kernels' edges (csrc/cuda/softmax_impl.cuh: one chunk, a warp's lanes, one
# CTA, the last/first of each width, clusters, the two-pass kernel); any other length too.
EDGE_LENGTHS = (0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 127, 128, 129, 255, 256,
                257, 500, 512, 1000, 1023, 1024, 1025, 2048, 4096, 4099)  # fmt: skip
CUDA_LONG_LENGTHS = (8192, 16384, 16385, 20000, 33000, 65536, 70000, 131072, 131080, 140000)
SCALES = (0.7, 1.0, 0.125, 2.0, 1 / 3, -0.5, 0.0)
SMALL_COUNTS = (1, 2, 3, 1, 2, 3, 0)  # batch sizes and row counts: 0 (empty) one time in seven
MAGNITUDES = (1.0, 2.0, 30.0, 1e4)


@st.composite
def softmax_examples(draw, op: str, device: str):
    """x of any small shape: batch 0/1/more, zero query rows, sk = 0/1/odd/edge lengths (on
    CUDA up to the two-pass kernel's rows), any memory layout, scale and magnitude (scores near
    the dtype's range ends one time in eight where 0 < scale <= 1); masks broadcast or per
    batch, dense or sparse, with fully masked rows; -inf scores."""
    lengths = EDGE_LENGTHS + (CUDA_LONG_LENGTHS if device == "cuda" else ())
    sk = draw(st.one_of(st.sampled_from(lengths), st.integers(1, 300)))
    budget = 1 << (20 if device == "cuda" else 15)  # elements of x, so examples stay quick
    rows_max = max(1, budget // max(sk, 1))
    sq = min(draw(st.sampled_from(SMALL_COUNTS + (4, 5, 6, 7))), rows_max)
    if op == "scaled_upper_triang_masked_softmax":
        ab = min(draw(st.sampled_from(SMALL_COUNTS + (4,))), rows_max // max(sq, 1))
        shape = (ab, sq, sk)
    else:
        b = min(draw(st.sampled_from(SMALL_COUNTS)), rows_max // max(sq, 1))
        h = max(1, min(draw(st.integers(1, 3)), rows_max // max(sq * b, 1)))
        shape = (b, h, sq, sk)
    scale = draw(st.sampled_from(SCALES))
    masked = op == "scaled_masked_softmax"
    return SoftmaxExample(
        op=op,
        dtype=draw(st.sampled_from(SOFTMAX_DTYPES)),
        shape=shape,
        scale=scale,
        magnitude=draw(st.sampled_from(MAGNITUDES)),
        x_layout=draw(st.sampled_from(LAYOUTS)),
        dy_layout=draw(st.sampled_from(LAYOUTS)),
        y_layout=draw(st.sampled_from(LAYOUTS)),
        mask_per_batch=draw(st.booleans()) if masked else False,
        mask_density=draw(st.sampled_from((0.0, 0.3, 0.9, 1.0))) if masked else 0.3,
        masked_row=draw(st.integers(-1, max(-1, sq - 1))) if masked else -1,
        mask_layout=draw(st.sampled_from(LAYOUTS)) if masked else "contiguous",
        neg_inf=draw(st.sampled_from((0.0, 0.1, 1.0))) if scale > 0 else 0.0,
        seed=draw(st.integers(0, 2**16)),
        range_end=draw(st.sampled_from((False,) * 7 + (True,))) if 0 < abs(scale) <= 1 else False,
    )


# ----------------------------------------------------------------------------- conversions

DATA_LAYOUTS = ("contiguous", "offset1", "offset3", "offset8", "strided", "transposed")
CU_LAYOUTS = ("contiguous", "offset1", "offset3", "strided")
SEQUENCES = (1, 2, 3, 4, 5, 1, 2, 3, 0)  # sequences per batch: none one time in nine


@st.composite
def convert_examples(draw, direction: str):
    """Any number of sequences (none, empty ones), padding beyond the longest, tokens past
    cu_seqlens[-1], every storage dtype, strided/offset data and cu_seqlens, and about half the
    time one broken argument rule (non-monotone, past the buffer, negative, nonzero start,
    a sequence longer than max_seqlen, num_tokens too small)."""
    return ConvertExample(
        direction=direction,
        dtype=draw(st.sampled_from(CONVERT_DTYPES)),
        lengths=tuple(draw(st.integers(0, 7)) for _ in range(draw(st.sampled_from(SEQUENCES)))),
        h=draw(st.integers(0, 3)),
        d=draw(st.integers(1, 9)),
        pad=draw(st.integers(0, 3)),
        trailing=draw(st.integers(0, 4)),
        data_layout=draw(st.sampled_from(DATA_LAYOUTS)),
        cu_layout=draw(st.sampled_from(CU_LAYOUTS)),
        corruption=draw(st.sampled_from(CORRUPTIONS[1:])) if draw(st.booleans()) else None,
        where=draw(st.integers(0, 4)),
        amount=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**16)),
    )


# ----------------------------------------------------------------------------- the module


def _family(layout: str) -> str:
    info = parse_layout(layout)
    return info.q_format if info.q_format == info.kv_format else "mixed"


FAMILIES = {
    family: [n for n in QKV_LAYOUTS if _family(n) == family]
    for family in ("sbhd", "bshd", "thd", "mixed")
}
MODULE_DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp16", "fp32")}
WINDOWS = (None, (0, 0), (1, 0), (2, 1), (-1, 2), (3, -1), (0, -1))
# the softmax scale, as a factor of the default d ** -0.5 (AttnCase.scale_factor): the default
# first (hypothesis shrinks towards it), flatter and sharper rows, a power of two
SCALE_FACTORS = (1.0, 0.37, 2.9, 0.125, 8.0)
BIASES = (
    ("no_bias", None, None),
    *[(kind, shape, None) for kind in ("pre_scale_bias", "post_scale_bias")
      for shape in BIAS_SHAPES],
    ("alibi", None, None),
    ("alibi", None, "h"),
    ("alibi", None, "bh"),
)  # fmt: skip
SOFTMAXES = (
    ("vanilla", "arg"), ("off-by-one", "arg"), ("learnable", "arg"), ("learnable", "param")
)  # fmt: skip


def supported_layouts(family: str, adapter=None) -> list[str]:
    """The family's layouts the adapter takes (all of them without one)."""
    return [n for n in FAMILIES[family] if adapter is None or n in adapter.support.layouts]


def _takes(adapter, name: str) -> bool:
    """Whether the adapter (none: every) takes the optional argument or output ``name``."""
    return adapter is None or adapter.support.takes(name)


@st.composite
def module_examples(draw, family: str, device: str, adapter=None):
    """One UnfusedDotProductAttention call of the family's layouts: any mask type, window and
    alignment, bias, softmax type, GQA/MQA group, MLA head dims, cross attention, ragged lengths
    (random, an empty sequence, one full sequence, trailing tokens), a longer kv cache, a
    softmax scale of SCALE_FACTORS times d ** -0.5. With an
    adapter, only what it declares (its layouts, dtypes, mask, bias and softmax types, optional
    arguments) is drawn, and a case it still turns away (Adapter.declines) is discarded."""
    a = adapter
    s = None if a is None else a.support
    layout = draw(st.sampled_from(supported_layouts(family, a)))
    info = parse_layout(layout)
    masks = [
        m for m in ATTN_MASK_TYPES
        if not (info.q_format == "thd" and m == "arbitrary") and (s is None or m in s.mask_types)
    ]  # fmt: skip
    mask_type = draw(st.sampled_from(masks))
    h = draw(st.sampled_from((1, 2, 3, 4)))
    groups = [g for g in (1, 2, 3, 4) if h % g == 0]
    hg = h if info.packing == "qkv" else draw(st.sampled_from(groups))
    sq = draw(st.integers(1, 8))
    skv = sq if info.packing == "qkv" else draw(st.integers(1, 8))
    d = draw(st.integers(1, 8))
    dv = d if info.packing else draw(st.integers(1, 8))
    biases = [
        (kind, shape, slopes) for kind, shape, slopes in BIASES
        if s is None or (kind in s.bias_types and (slopes is None or s.takes("alibi_slopes")))
    ]  # fmt: skip
    bias_type, bias_shape, slopes = draw(st.sampled_from(biases))
    softmaxes = [
        (kind, via) for kind, via in SOFTMAXES
        if s is None or (kind in s.softmax_types
                         and (kind != "learnable" or s.takes("softmax_offset")))
    ]  # fmt: skip
    softmax_type, offset_via = draw(st.sampled_from(softmaxes))
    window = draw(st.sampled_from(WINDOWS if _takes(a, "window_size") else (None,)))
    if window is not None and "causal" in mask_type and window[1] > 0:
        window = (window[0], 0)  # a right context conflicts with a causal type (an error case)
    alignments = (None, True, False) if _takes(a, "bottom_right_diagonal") else (None,)
    padding_from = [
        p for p, name in (("cu_seqlens", "cu_seqlens_padding"), ("mask", "padding_mask"),
                          ("mask_left", "padding_mask"))
        if _takes(a, name)
    ] or ["cu_seqlens"]  # fmt: skip
    dtypes = [t for t in MODULE_DTYPES[device] if s is None or t in s.dtypes]
    thd_cache = info.q_format == "thd" and info.kv_format != "thd"
    case = AttnCase(
        layout, draw(st.sampled_from(dtypes)), mask_type, device=device,
        b=draw(st.integers(1, 3)), sq=sq, skv=skv, h=h, hg=hg, d=d, dv=dv,
        bias_type=bias_type, bias_shape=bias_shape, alibi_slopes=slopes,
        softmax_type=softmax_type, offset_via=offset_via, window=window,
        bottom_right_diagonal=draw(st.sampled_from(alignments)),
        padding_from=draw(st.sampled_from(padding_from)),
        varlen=draw(st.sampled_from(("random", "zero_length", "full", "trailing"))),
        kv_cache_extra=draw(st.integers(0, 3)) if thd_cache else 0,
        return_max_logit=draw(st.booleans()) if _takes(a, "max_logit") else False,
        scale_factor=draw(st.sampled_from(SCALE_FACTORS)),
    )  # fmt: skip
    hypothesis.assume(case.invalid_reason() is None)
    hypothesis.assume(a is None or not a.declines(case))
    return ModuleExample(case, seed=draw(st.integers(0, 2**16)))


# ----------------------------------------------------------------------------- explicit examples
# Run first, on every profile: each category the issue names, whatever the draws reach.


def softmax_explicit(op: str) -> list[SoftmaxExample]:
    """Batch 1 with one column, zero query rows, an empty batch, odd misaligned and transposed
    rows, a long row with every layout change, a broadcast x at scale 0, all scores -inf, aligned
    16-bit rows at scales -0.5 and 0, and (masked op) a fully masked per-batch mask starting
    mid-vector."""
    three = op == "scaled_upper_triang_masked_softmax"

    def shape(b, h, sq, sk):
        return (b * h, sq, sk) if three else (b, h, sq, sk)

    ex = [
        SoftmaxExample(op, "bf16", shape(1, 1, 1, 1), 0.7),
        SoftmaxExample(op, "fp32", shape(1, 2, 0, 17), 0.7),
        SoftmaxExample(op, "fp16", shape(0, 2, 3, 17), 0.7),
        SoftmaxExample(op, "bf16", shape(2, 2, 3, 17), 0.7, x_layout="offset1",
                       dy_layout="offset3", y_layout="strided", seed=1),
        SoftmaxExample(op, "fp16", shape(1, 2, 3, 4099), 1.0, x_layout="transposed",
                       dy_layout="expanded", y_layout="offset8", seed=2),
        SoftmaxExample(op, "fp32", shape(2, 3, 2, 1025), 0.0, x_layout="expanded", seed=3),
        SoftmaxExample(op, "bf16", shape(1, 1, 4, 33), 0.7, neg_inf=1.0, seed=4),
        # 16-byte rows at scale <= 0: the CUDA 16-bit fast kernels hold only the scale > 0 path,
        # so these must take the one-element kernels (softmax_impl.cuh, wide_chunks_ok)
        SoftmaxExample(op, "bf16", shape(1, 2, 3, 64), -0.5, seed=5),
        SoftmaxExample(op, "fp16", shape(2, 1, 3, 1024), 0.0, seed=6),
    ]  # fmt: skip
    if op == "scaled_masked_softmax":
        ex.append(SoftmaxExample(op, "bf16", (3, 2, 5, 40), 0.7, mask_per_batch=True,
                                 mask_density=1.0, mask_layout="offset1", seed=5))  # fmt: skip
        ex.append(SoftmaxExample(op, "fp32", (2, 1, 3, 64), 2.0, mask_density=0.3, masked_row=2,
                                 mask_layout="expanded", neg_inf=0.1, seed=6))  # fmt: skip
    return ex


def convert_explicit(direction: str) -> list[ConvertExample]:
    """Every broken rule once (with an empty sequence and trailing tokens around it); one full
    sequence; empty sequences with fp8 storage, misaligned data and strided cu_seqlens; no
    sequence at all; rows of an odd byte count."""
    ex = [
        ConvertExample(direction, "fp32", (3, 0, 4), trailing=2, pad=1, corruption=c, where=1,
                       amount=1, seed=i)
        for i, c in enumerate(CORRUPTIONS[1:])
    ]  # fmt: skip
    ex += [
        ConvertExample(direction, "bf16", (6,)),
        ConvertExample(direction, "fp8e4m3", (0, 3, 0), trailing=3, data_layout="offset1",
                       cu_layout="strided", seed=7),
        ConvertExample(direction, "fp16", (), trailing=2),
        ConvertExample(direction, "fp8e5m2", (2, 5), h=1, d=3, pad=2, data_layout="transposed"),
    ]  # fmt: skip
    return ex


def module_explicit(family: str, device: str, adapter=None) -> list[ModuleExample]:
    """A GQA call with padding (an empty sequence where ragged), one full-length sequence with
    trailing tokens, and sink softmax with alibi and a window, on the family's first layout;
    for an adapter, those it supports."""
    layout = FAMILIES[family][-1]  # the unpacked one: GQA and MLA allowed
    dtype = MODULE_DTYPES[device][0]
    cache = 2 if family == "mixed" and layout.startswith("thd") else 0
    base = dict(device=device, b=2, sq=5, skv=5, h=4, hg=2, d=8, dv=8, kv_cache_extra=cache)
    examples = [
        ModuleExample(AttnCase(layout, dtype, "padding_causal", varlen="zero_length", **base)),
        ModuleExample(
            AttnCase(layout, dtype, "causal_bottom_right", varlen="full", **dict(base, b=1)), seed=1
        ),  # fmt: skip
        ModuleExample(
            AttnCase(
                layout,
                dtype,
                "padding",
                varlen="trailing",
                softmax_type="learnable",
                bias_type="alibi",
                window=(2, 1),
                return_max_logit=True,
                **base,
            ),
            seed=2,
        ),  # fmt: skip
    ]
    return [
        ex for ex in examples
        if adapter is None or not adapter.declines(replace(ex.case, device=device))
    ]  # fmt: skip
