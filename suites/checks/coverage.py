"""What a case runs as on an adapter that lacks part of it (docs/adapters.md, "Coverage").

Two rules, so that a case skips whole only when nothing of it can run:

- An output the adapter does not return (max_logit: not among its Support ``outputs``, or a rule of
  its own such as flex_attention's max_logit with a sink softmax) is not asked for: the case runs
  without it and every other tensor is judged. Every suite that runs a case asking for max_logit
  follows it; the report records ``not_judged={"max_logit": the adapter's reason}``.
- test_broad, a sample meant to judge every feature in combination with the others: each feature
  the adapter declines is replaced by the nearest value it takes (``NEAREST_*`` below: an
  optional argument is dropped, a layout of the same q format, a mask, bias or softmax type
  close to the asked one, another dtype of the device's matrix), preferring the variant that
  changes the fewest and the least central features (``WEIGHT``), so that the sample's other
  features are still judged. The report records ``substituted={feature: "asked -> ran: the
  adapter's reasons"}``. A case skips only when no variant is accepted (a device, a q format or
  a shape the adapter cannot take). The test id stays the asked case's, and so do its inputs'
  seed.

An adapter that takes the case as asked (te_fast: everything) runs it unchanged and records
nothing more.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from te_conformance.suites.cases import DEVICE_DTYPES, AttnCase
from te_ref.layouts import parse_layout

# The mask types nearest to each, nearest first: the same causal band without the lengths, the
# lengths without the band, the other alignment, no mask.
NEAREST_MASK = {
    "no_mask": ("padding", "arbitrary"),
    "padding": ("no_mask", "arbitrary"),
    "causal": ("causal_bottom_right", "padding_causal", "no_mask"),
    "causal_bottom_right": ("causal", "padding_causal_bottom_right", "no_mask"),
    "padding_causal": ("causal", "padding", "padding_causal_bottom_right", "no_mask"),
    "padding_causal_bottom_right": (
        "causal_bottom_right", "padding", "padding_causal", "causal", "no_mask",
    ),
    "arbitrary": ("no_mask",),
}  # fmt: skip
# (softmax_type, offset_via) -> the nearest: the learnable offset passed the other way, the sink
# with offset 0, then no sink
NEAREST_SOFTMAX = {
    ("learnable", "param"): (("learnable", "arg"), ("off-by-one", "arg"), ("vanilla", "arg")),
    ("learnable", "arg"): (("learnable", "param"), ("off-by-one", "arg"), ("vanilla", "arg")),
    ("off-by-one", "arg"): (("vanilla", "arg"),),
    ("vanilla", "arg"): (),
}
NEAREST_PADDING = {
    "cu_seqlens": ("mask", "mask_left"),
    "mask": ("cu_seqlens", "mask_left"),
    "mask_left": ("mask", "cu_seqlens"),
}
# What a step down a feature's ladder costs: an optional argument before the layout and dtype,
# those before the mask, bias and softmax types the sample is about.
WEIGHT = {
    "window": 1, "bottom_right_diagonal": 1, "padding_from": 1, "layout": 2, "dtype": 2,
    "bias": 3, "softmax": 3, "mask_type": 3,
}  # fmt: skip
MAX_TRIED = 4000  # variants tried before giving up (each is one Adapter.declines call)
KV_CACHE_EXTRA = 7  # suites/cases.py _build: a thd q's bshd/sbhd kv cache longer by this much


def _bias(case: AttnCase):
    return (case.bias_type, case.bias_shape, case.alibi_slopes)


def _nearest_bias(bias) -> tuple:
    """(bias_type, bias_shape, alibi_slopes) -> the nearest: the other scale's bias of the same
    shape, ALiBi's default slopes for user slopes, then no bias."""
    kind, shape, slopes = bias
    other = {"pre_scale_bias": "post_scale_bias", "post_scale_bias": "pre_scale_bias"}
    if kind in other:
        return ((other[kind], shape, None), ("no_bias", None, None))
    if kind == "alibi":
        return ((("alibi", None, None),) if slopes else ()) + (("no_bias", None, None),)
    return ()


def _reasons(adapter, case: AttnCase) -> list[str]:
    """The texts of the adapter's reasons to decline ``case`` (Adapter.declines)."""
    return [r.text for r in adapter.declines(case)]


def _kv_cache(info) -> bool:
    return info.q_format == "thd" and info.kv_format != "thd"


def _layout_ladder(adapter, case: AttnCase) -> list[str]:
    """The adapter's layouts of the case's q format, nearest first: the same packing, the same
    kv format, separate tensors before packed ones."""
    asked = case.layout_info

    def key(name):
        info = parse_layout(name)
        return (name != case.layout, info.packing != asked.packing,
                info.kv_format != asked.kv_format, _kv_cache(info) != _kv_cache(asked),
                info.packing is not None, info.pack_dim != asked.pack_dim, name)  # fmt: skip

    same_q = [n for n in adapter.support.layouts if parse_layout(n).q_format == asked.q_format]
    return sorted(same_q, key=key)


def _ladders(adapter, case: AttnCase) -> dict[str, list]:
    """feature -> its values the adapter declares, the asked one first where declared."""

    def ladder(asked, nearer, allowed):
        return list(dict.fromkeys(v for v in (asked, *nearer) if allowed(v)))

    support = adapter.support
    padding_ok = {
        "cu_seqlens": support.takes("cu_seqlens_padding"),
        "mask": support.takes("padding_mask"), "mask_left": support.takes("padding_mask"),
    }  # fmt: skip
    return {
        "window": ladder(case.window, (None,) if case.window is not None else (),
                         lambda w: w is None or support.takes("window_size")),
        "bottom_right_diagonal": ladder(
            case.bottom_right_diagonal, (None,) if case.bottom_right_diagonal is not None else (),
            lambda d: d is None or support.takes("bottom_right_diagonal"),
        ),
        # the asked source stays first: it means nothing where the case has no padding lengths
        "padding_from": ladder(case.padding_from, NEAREST_PADDING[case.padding_from],
                               lambda p: p == case.padding_from or padding_ok[p]),
        "layout": _layout_ladder(adapter, case),
        "dtype": ladder(case.dtype, DEVICE_DTYPES.get(case.device, ()),
                        lambda d: d in support.dtypes),
        "bias": ladder(_bias(case), _nearest_bias(_bias(case)),
                       lambda b: b[0] in support.bias_types
                       and (b[2] is None or support.takes("alibi_slopes"))),
        "softmax": ladder((case.softmax_type, case.offset_via),
                          NEAREST_SOFTMAX[(case.softmax_type, case.offset_via)],
                          lambda s: s[0] in support.softmax_types),
        "mask_type": ladder(case.mask_type, NEAREST_MASK[case.mask_type],
                            lambda m: m in support.mask_types),
    }  # fmt: skip


def _with(case: AttnCase, feature: str, value) -> AttnCase:
    """``case`` with one feature set to ``value`` (a layout change keeps a thd q's kv cache
    consistent, as suites/cases.py _build makes it)."""
    if feature == "bias":
        return replace(case, bias_type=value[0], bias_shape=value[1], alibi_slopes=value[2])
    if feature == "softmax":
        return replace(case, softmax_type=value[0], offset_via=value[1])
    if feature == "layout":
        new = replace(case, layout=value)
        before, after = _kv_cache(case.layout_info), _kv_cache(new.layout_info)
        if before and not after:
            new = replace(new, kv_cache_extra=0)
        elif after and not before:
            new = replace(new, kv_cache_extra=KV_CACHE_EXTRA, skv=new.sq)
        return new
    return replace(case, **{feature: value})


def _show(feature: str, case: AttnCase) -> str:
    if feature == "bias":
        kind, shape, slopes = _bias(case)
        return kind + (f"_{shape}" if shape else "") + (f"_slopes_{slopes}" if slopes else "")
    if feature == "softmax":
        return case.softmax_type + ("_param" if case.offset_via == "param" else "")
    return str(getattr(case, feature))


def _padded_bshd(case: AttnCase) -> bool:
    return case.mask_type.startswith("padding") and case.layout_info.q_format != "thd"


def nearest_supported(adapter, case: AttnCase) -> tuple[AttnCase, dict[str, str]] | None:
    """(the nearest variant of ``case`` the adapter takes, {feature: "asked -> ran: why"}), or
    None when it takes none. Variants are tried cheapest first (the sum over features of
    WEIGHT times the steps down the feature's ladder, then the fewest features changed)."""
    ladders = _ladders(adapter, case)
    if case.device not in adapter.support.devices or not all(ladders.values()):
        return None
    names = list(ladders)
    combos = sorted(
        itertools.product(*(range(len(ladders[n])) for n in names)),
        key=lambda idx: (sum(WEIGHT[n] * i for n, i in zip(names, idx)),
                         sum(i > 0 for i in idx), idx),
    )  # fmt: skip
    asked_reasons = _reasons(adapter, case)
    tried = 0
    for idx in combos:
        variant = case
        for name, i in zip(names, idx):
            variant = _with(variant, name, ladders[name][i])
        if variant.padding_from != case.padding_from and not _padded_bshd(variant):
            continue  # padding_from means nothing here: the same variant as the asked source
        if variant.invalid_reason():
            continue
        tried += 1
        if tried > MAX_TRIED:
            return None
        if _reasons(adapter, variant):
            continue
        changed = [n for n in names if _show(n, variant) != _show(n, case)]
        return variant, {n: _substitution(adapter, case, n, variant, asked_reasons)
                         for n in changed}  # fmt: skip
    return None


def _substitution(adapter, case, feature, variant, asked_reasons) -> str:
    """``asked -> ran: why``: the adapter's reasons that this feature's substitution alone
    removes (else that the other substitutions needed it)."""
    if feature == "bias":
        value = _bias(variant)
    elif feature == "softmax":
        value = (variant.softmax_type, variant.offset_via)
    else:
        value = getattr(variant, feature)
    alone = _with(case, feature, value)
    removed = [r for r in asked_reasons if r not in set(_reasons(adapter, alone))]
    why = "; ".join(removed) or "needed with the other substitutions"
    return f"{_show(feature, case)} -> {_show(feature, variant)}: {why}"


def runnable(
    adapter, case: AttnCase, substitute: bool = False
) -> tuple[AttnCase, dict[str, dict[str, str]]] | None:
    """(the case as ``adapter`` runs it, what the report records about the difference:
    ``not_judged`` and, with ``substitute``, ``substituted``), or None when the adapter cannot
    run it. A case the adapter takes as asked comes back unchanged, with nothing to record."""
    asked = _reasons(adapter, case)
    if not asked:
        return case, {}
    run, notes = case, {}
    if case.return_max_logit:
        without = replace(case, return_max_logit=False)
        left = set(_reasons(adapter, without))
        gone = [r for r in asked if r not in left]
        if gone:  # the refusal was (in part) max_logit's: run without it
            run, notes["not_judged"] = without, {"max_logit": "; ".join(gone)}
    if _reasons(adapter, run):
        found = nearest_supported(adapter, run) if substitute else None
        if found is None:
            return None
        run, notes["substituted"] = found
    return run, notes
