"""`--impl transformer_engine`: a Transformer Engine install's unfused attention in the suites."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from types import ModuleType

import torch

from suites.adapters.base import Adapter
from suites.cases import AttnCase
from te_ref.layouts import LAYOUTS, parse_layout

# Set before transformer_engine is imported (TE reads some of them at import time): only the
# unfused backend may run, and it may emulate FP8 (TE >= 2.8 runs FP8 attention unfused only so).
TE_ENV = {
    "NVTE_FLASH_ATTN": "0",
    "NVTE_FUSED_ATTN": "0",
    "NVTE_UNFUSED_ATTN": "1",
    "NVTE_UnfusedDPA_Emulate_FP8": "1",
}

# DotProductAttention arguments newer than TE 2.0, with the release that added them (the skip
# reason on an older install names it).
ADDED_IN = {
    "softmax_type": "2.8",
    "fp8_output": "2.8",
    "return_max_logit": "2.9",
    "bottom_right_diagonal": "2.12",
}

# TE takes qkv_format="thd" only with a padding mask type; SPEC §1 has thd respect sequence
# boundaries whatever the type, so these are the same masks.
THD_MASK_TYPES = {
    "no_mask": "padding",
    "causal": "padding_causal",
    "causal_bottom_right": "padding_causal_bottom_right",
}

# q in one format, the kv cache in another: TE builds those only inside its KV cache
# (inference_params), DotProductAttention.forward takes one qkv_format.
MIXED_LAYOUTS = tuple(
    lay for lay in LAYOUTS if parse_layout(lay).q_format != parse_layout(lay).kv_format
)

# Forward arguments that pass to TE under the same name and meaning. attention_mask is one of
# them: True means "masked out" in TE as in SPEC §2.3, so it is passed as it is, never inverted.
SAME_NAME = (
    "cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv", "attention_mask",
    "bottom_right_diagonal", "core_attention_bias_type", "core_attention_bias", "alibi_slopes",
    "fp8_output",
)  # fmt: skip

_loaded: tuple[ModuleType | None, str | None] | None = None  # (transformer_engine.pytorch, why not)


def load() -> tuple[ModuleType | None, str | None]:
    """(transformer_engine.pytorch, None), or (None, why it cannot be used); imported once, with
    TE_ENV set first. Called at run time only, never at collection."""
    global _loaded
    if _loaded is None:
        _loaded = _import()
    return _loaded


def _import() -> tuple[ModuleType | None, str | None]:
    imported_before = "transformer_engine.pytorch" in sys.modules
    overridden = sorted(k for k, v in TE_ENV.items() if os.environ.get(k) != v)
    os.environ.update(TE_ENV)
    try:
        import transformer_engine.pytorch as te
    except Exception as e:  # not installed, or installed without its CUDA libraries
        return None, f"transformer_engine not installed: {type(e).__name__}: {e}"
    if imported_before and overridden:
        return None, (
            "transformer_engine was imported before this adapter could force its unfused backend "
            f"({', '.join(overridden)} differed from {TE_ENV}); set them in the environment "
            "before starting pytest"
        )
    return te, None


def te_version() -> str:
    te = sys.modules.get("transformer_engine")
    return str(getattr(te, "__version__", "?"))


def accepted(fn) -> frozenset[str]:
    """The keyword arguments a TE callable takes (its installed version's signature)."""
    return frozenset(inspect.signature(fn).parameters)


def te_mask_type(mask_type: str, qkv_format: str) -> str:
    """TE's attn_mask_type for ours: the same name, with padding made explicit on thd."""
    return THD_MASK_TYPES.get(mask_type, mask_type) if qkv_format == "thd" else mask_type


def te_window_size(window, mask_type: str, bound: int):
    """TE's window_size for ours (SPEC §2.3, -1 = unbounded).

    TE accepts (-1, 0) or (>= 0, 0) with a causal type, else (-1, -1) or (>= 0, >= 0) (its
    check_set_window_size; it asserts or silently rewrites otherwise, e.g. (-1, 0) with no_mask
    becomes no window at all). One unbounded side therefore becomes ``bound``, a width no row
    reaches (sq + skv), which masks nothing: the same window in a form TE takes.
    """
    if window is None:
        return None
    left, right = window
    if "causal" in mask_type:  # SPEC §2.3: causal types force wr = 0 (TE does the same)
        return (left, 0)
    if (left, right) == (-1, -1):
        return (-1, -1)
    return (bound if left == -1 else left, bound if right == -1 else right)


def _window_bound(case: AttnCase) -> int:
    return case.sq + case.skv + case.kv_cache_extra


def te_init_kwargs(
    case: AttnCase, scale: float | None, dropout: float, takes: frozenset[str]
) -> dict:
    """DotProductAttention's constructor arguments for a case; ``takes``: the names the installed
    TE accepts (optional ones it lacks are left out; a case that needs one is skipped)."""
    fmt = case.layout_info.q_format
    kwargs = dict(
        num_attention_heads=case.h,
        kv_channels=case.d if case.d == case.dv else (case.d, case.dv),
        num_gqa_groups=case.hg,
        attention_dropout=dropout,
        qkv_format=fmt,
        attn_mask_type=te_mask_type(case.mask_type, fmt),
        window_size=te_window_size(case.window, case.mask_type, _window_bound(case)),
        attention_type=case.attention_type,
        softmax_scale=scale,
    )
    for name, value in (
        ("bottom_right_diagonal", case.bottom_right_diagonal),
        ("softmax_type", case.softmax_type),
        ("return_max_logit", case.return_max_logit),
    ):
        if name in takes:
            kwargs[name] = value
    return kwargs


def te_forward_kwargs(case: AttnCase, kwargs: dict) -> dict:
    """DotProductAttention.forward's keyword arguments for one of our calls (without the tensors
    the adapter handles itself: softmax_offset, fp8, fp8_meta)."""
    kwargs = dict(kwargs)
    info = parse_layout(kwargs.pop("qkv_layout"))
    if info.q_format != info.kv_format:
        raise ValueError(
            f"transformer_engine: qkv_layout {info.name!r} puts q and k/v in different formats; "
            "DotProductAttention.forward takes one qkv_format (TE builds mixed formats only "
            "inside its KV cache, inference_params)"
        )
    mask_type = kwargs.pop("attn_mask_type", "no_mask")
    out = {"qkv_format": info.q_format, "attn_mask_type": te_mask_type(mask_type, info.q_format)}
    if "window_size" in kwargs:
        out["window_size"] = te_window_size(
            kwargs.pop("window_size"), mask_type, _window_bound(case)
        )
    for name in SAME_NAME:
        if name in kwargs:
            out[name] = kwargs.pop(name)
    if kwargs:
        raise TypeError(f"transformer_engine adapter: no TE mapping for {sorted(kwargs)}")
    return out


def te_recipe(te: ModuleType, recipe):
    """TE's recipe (fp8_dpa=True: FP8 in attention) for a te_fast/te_ref style one: fp8_format
    by name; DelayedScaling's margin, amax_history_len and amax_compute_algo; CurrentScaling is
    TE's Float8CurrentScaling."""
    te_recipes = importlib.import_module(te.__name__.rsplit(".", 1)[0] + ".common.recipe")
    name = getattr(recipe.fp8_format, "name", str(recipe.fp8_format))
    if name == "E5M2":
        raise NotImplementedError(
            "transformer_engine rejects Format.E5M2 in its recipes ('Pure E5M2 training is not "
            "supported'): use HYBRID or E4M3"
        )
    fmt = te_recipes.Format[name]
    if hasattr(recipe, "amax_history_len"):
        return te_recipes.DelayedScaling(
            fp8_format=fmt, margin=recipe.margin, amax_history_len=recipe.amax_history_len,
            amax_compute_algo=recipe.amax_compute_algo, fp8_dpa=True,
        )  # fmt: skip
    return te_recipes.Float8CurrentScaling(fp8_format=fmt, fp8_dpa=True)


def te_autocast(te: ModuleType, recipe):
    """TE's FP8 region: autocast(recipe=...) (TE >= 2.12), else fp8_autocast(fp8_recipe=...)."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)


class TransformerEngine(Adapter):
    """transformer_engine.pytorch.DotProductAttention with only its unfused backend allowed.

    NOT RUN AGAINST A REAL TRANSFORMER ENGINE HERE: TE's core wheel needs CUDA, and neither the
    project's CPU machines nor its GPU machine (no network, no TE in the image) can install it.
    The mapping below is written against TE's source (the 2.x `DotProductAttention` signature,
    checked from 2.0 to 2.18 and the 2.20 development branch) and unit-tested on the CPU against a
    recording stand-in (tests/test_te_adapter.py). Without an importable TE every case of this
    adapter skips with "transformer_engine not installed: <the import error>".

    How it drives TE: NVTE_FLASH_ATTN=0, NVTE_FUSED_ATTN=0 (and NVTE_UNFUSED_ATTN=1,
    NVTE_UnfusedDPA_Emulate_FP8=1) are set before TE is imported, and every call checks TE's
    backend cache: a call that did not run UnfusedDotProductAttention is an error, never a
    silent test of another backend. Our call maps onto TE's arguments as follows:

    - constructor: num_attention_heads = h, kv_channels = d or (d, dv), num_gqa_groups = hg,
      attention_dropout, qkv_format, attn_mask_type, window_size, attention_type, softmax_scale;
      bottom_right_diagonal, softmax_type, return_max_logit where the installed TE has them.
    - forward: qkv_layout -> qkv_format (TE detects packing from the strides of the q/k/v views);
      cu_seqlens_q/kv, max_seqlen_q/kv, attention_mask (True = masked out in both: not inverted),
      bottom_right_diagonal, core_attention_bias_type, core_attention_bias, alibi_slopes,
      fp8_output by the same name; attn_mask_type by the same name, except that thd takes the
      padding form (no_mask -> padding, causal -> padding_causal, ...; TE requires it, SPEC §1
      means it); window_size with one unbounded side (-1) as a bound wider than any row, the form
      TE accepts.
    - softmax_offset ("learnable"): TE has no such forward argument; the module owns a Parameter
      [h], into which the case's offset is loaded (its gradient is the case's dsoftmax_offset).
    - fp8=True, fp8_meta={"recipe": ...}: TE takes FP8 from a context, so the call runs under
      TE's autocast with the recipe translated (te_recipe; fp8_dpa=True). The FP8 suite has no
      adapter axis, so this path is exercised by the unit tests only.

    Skips with a reason (TE cannot express the case): CPU tensors (TE asserts CUDA); the four
    mixed-format inference layouts (TE takes them only through inference_params); a case needing
    an argument the installed TE lacks (ADDED_IN); thd with an arbitrary mask; argument
    validation (TE asserts, with its own messages) and CUDA-graph capture under torch.compile
    (TE 2.0-2.18 wrap forward in no_torch_dynamo, so fullgraph cannot trace it).

    Failures to expect, where TE's source differs from the SPEC (the suites report them):
    - SPEC §2.4 "a row with every column masked is all 0 ... in every path, kernel or
      fallback": TE fills masked scores with -10000. Its fused softmax kernel (fp16/bf16 only,
      16 < sk < 16384, sk % 8 == 0, sq % 4 == 0, b*h % 4 == 0, mask [1|b, 1, sq, sk]) returns 0
      for such a row; everything else (every fp32 input, the suites' GPU size sq = skv = 77) falls
      back to an fp32 torch.softmax, which makes the row uniform (1/sk): the output is the mean
      of V, not 0. TE zeroes padded query rows afterwards, so this shows with arbitrary masks and
      windows that empty a row. Masked positions are exactly 0 only while real scores stay well
      above -10000.
    - SPEC §2.3 padding, "key column j is padding iff j >= seqlen_kv": with
      attention_type="self" TE's unfused backend builds the padding mask from cu_seqlens_q alone
      (get_padding_mask), so kv lengths that differ from the query lengths are not applied.
    - SPEC §2.3 "bottom_right_diagonal overrides the alignment": TE forces top-left for causal
      and padding_causal and bottom-right for the *_bottom_right types, whatever is passed.
    - docs/SEMANTICS.md max_logit: a head with every position masked gives -10000 in TE, not -inf.
    """

    name = "transformer_engine"
    devices = ("cuda",)
    layouts = tuple(lay for lay in LAYOUTS if lay not in MIXED_LAYOUTS)
    why_unsupported = {
        "cpu": "DotProductAttention takes CUDA tensors only",
        **dict.fromkeys(
            MIXED_LAYOUTS,
            "q and the kv cache in different formats exist in TE only inside its KV cache "
            "(inference_params); DotProductAttention.forward takes one qkv_format",
        ),
    }
    supports_fp8 = True
    dropout = sync_free = True
    why_not = {
        "validates_arguments": "TE checks its arguments with assert statements and its own "
        "messages, not the ValueErrors this test matches",
        "dropout_ctx": "not mapped: DotProductAttention takes no attention_dropout_ctx but "
        "get_rng_state_tracker (a tracker whose fork() it enters); the adapter passes none",
        "capturable": "TE 2.0-2.18 wrap DotProductAttention.forward in no_torch_dynamo "
        "(torch._dynamo.disable), so torch.compile(fullgraph=True) cannot trace it; TE's own "
        "CUDA-graph route is make_graphed_callables",
    }
    default = False

    def lacks(self, capability: str) -> str | None:
        reason = super().lacks(capability)
        return load()[1] or reason

    def not_supported_reasons(self, case: AttnCase) -> list[str]:
        te, missing = load()
        if missing:
            return [missing]
        reasons = super().not_supported_reasons(case)
        takes = accepted(te.DotProductAttention.__init__) | accepted(te.DotProductAttention.forward)
        for name, needed in (
            ("softmax_type", case.softmax_type != "vanilla"),
            ("return_max_logit", case.return_max_logit),
            ("bottom_right_diagonal", case.bottom_right_diagonal is not None),
        ):
            if needed and name not in takes:
                reasons.append(
                    f"transformer_engine {te_version()}: DotProductAttention has no {name} "
                    f"argument (TE {ADDED_IN[name]}+)"
                )
        if case.layout_info.q_format == "thd" and case.mask_type == "arbitrary":
            reasons.append("transformer_engine takes qkv_format='thd' with padding mask types only")
        return reasons

    def unavailable_reason(self, device: str) -> str | None:
        return load()[1]

    def _te(self) -> ModuleType:
        te, missing = load()
        if missing:
            raise RuntimeError(missing)
        return te

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        if dropout_ctx is not None:
            raise NotImplementedError(self.lacks("dropout_ctx"))
        te = self._te()
        takes = accepted(te.DotProductAttention.__init__)
        return te.DotProductAttention(**te_init_kwargs(case, scale, dropout, takes)).to(case.device)

    def call(self, module, case, q, k, v, kwargs):
        te = self._te()
        kwargs = dict(kwargs)
        offset = kwargs.pop("softmax_offset", None)
        fp8, fp8_meta = kwargs.pop("fp8", False), kwargs.pop("fp8_meta", None)
        stand_in = {}
        if offset is not None:
            if case.softmax_type != "learnable":
                raise ValueError(
                    "transformer_engine: softmax_offset needs softmax_type='learnable'"
                )
            with torch.no_grad():  # TE's module owns the offset: load the case's values into it
                module.softmax_offset.copy_(offset.reshape(-1))
            stand_in["offset"] = module.softmax_offset
        forward = te_forward_kwargs(case, kwargs)
        region = contextlib.nullcontext()
        if fp8:
            if case.softmax_type != "vanilla" or case.return_max_logit:
                raise NotImplementedError(
                    "transformer_engine runs FP8 attention with neither sink softmax nor "
                    "return_max_logit (get_attention_backend disables every backend)"
                )
            if not (fp8_meta and "recipe" in fp8_meta):
                raise ValueError("transformer_engine: fp8=True needs fp8_meta={'recipe': ...}")
            region = te_autocast(te, te_recipe(te, fp8_meta["recipe"]))
        with region:
            result = module(q, k, v, **forward)
        _require_unfused(module)
        out, max_logit = result if case.return_max_logit else (result, None)
        return out, max_logit, stand_in


def _require_unfused(module) -> None:
    """Raise unless TE's backend cache says the last call ran UnfusedDotProductAttention."""
    backends = getattr(sys.modules.get(type(module).__module__), "_attention_backends", None)
    if isinstance(backends, dict) and backends.get("use_unfused_attention") is False:
        ran = [k for k in ("use_flash_attention", "use_fused_attention") if backends.get(k)]
        raise RuntimeError(
            f"transformer_engine ran {ran or 'another backend'}, not UnfusedDotProductAttention, "
            f"although {TE_ENV} were set before it was imported"
        )
