"""`--impl transformer_engine`: Transformer Engine's DotProductAttention, routed to its unfused
backend, in the suites. With the real TE (wheel and native extension) on a GPU runner it runs as
installed; on a machine without CUDA, TE 2.20.2's real Python runs on the CPU through the
stand-ins of suites/adapters/te_cpu_standin.py (docs/transformer_engine.md)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from types import ModuleType

import torch

from te_conformance.suites import te_deviations
from te_conformance.suites.adapters import te_cpu_standin as te_cpu
from te_conformance.suites.adapters.base import Adapter, Rule, Support, distribution_version
from te_conformance.suites.adapters.te_loader import (  # noqa: F401  (re-exported)
    TE_ENV,
    load,
    reset_alibi_cache,
    stand_in,
    te_version,
)
from te_conformance.suites.cases import AttnCase
from te_ref.layouts import LAYOUTS, parse_layout

# DotProductAttention arguments newer than TE 2.0, with the release that added them (the skip
# reason on an older install names it).
ADDED_IN = {
    "softmax_type": "2.8",
    "fp8_output": "2.8",
    "return_max_logit": "2.9",
    "bottom_right_diagonal": "2.12",
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
    "window_size", "bottom_right_diagonal", "core_attention_bias_type", "core_attention_bias",
    "alibi_slopes", "fp8_output",
)  # fmt: skip

def accepted(fn) -> frozenset[str]:
    """The keyword arguments a TE callable takes (its installed version's signature)."""
    return frozenset(inspect.signature(fn).parameters)


def te_init_kwargs(
    case: AttnCase, scale: float | None, dropout: float, takes: frozenset[str]
) -> dict:
    """DotProductAttention's constructor arguments for a case; ``takes``: the names the installed
    TE accepts (optional ones it lacks are left out; a case that needs one is skipped)."""
    kwargs = dict(
        num_attention_heads=case.h,
        kv_channels=case.d if case.d == case.dv else (case.d, case.dv),
        num_gqa_groups=case.hg,
        attention_dropout=dropout,
        qkv_format=case.layout_info.q_format,
        attn_mask_type=case.mask_type,
        window_size=case.window,
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
    the adapter handles itself: softmax_offset, fp8, fp8_meta). Everything passes as given, so
    that TE's own normalisation (check_set_window_size, the alignment rules, the thd check) is
    what the suites judge."""
    kwargs = dict(kwargs)
    info = parse_layout(kwargs.pop("qkv_layout"))
    if info.q_format != info.kv_format:
        raise ValueError(
            f"transformer_engine: qkv_layout {info.name!r} puts q and k/v in different formats; "
            "DotProductAttention.forward takes one qkv_format (TE builds mixed formats only "
            "inside its KV cache, inference_params)"
        )
    out = {"qkv_format": info.q_format, "attn_mask_type": kwargs.pop("attn_mask_type", "no_mask")}
    for name in SAME_NAME:
        if name in kwargs:
            out[name] = kwargs.pop(name)
    mask = out.get("attention_mask")
    if isinstance(mask, (tuple, list)) and case.attention_type == "self":
        # TE's self attention takes one [b, 1, 1, sq] padding mask for queries and keys (its
        # docstring); a pair passes as that form, its query mask (TE deviation D2 where the
        # key mask differs)
        out["attention_mask"] = mask[0]
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

    Where it runs: with the real TE (wheel and native extension) on a GPU runner, as installed,
    on CUDA cases (NOT RUN HERE: the project's GPU machine has no TE). Without CUDA, TE 2.20.2's
    real Python on CPU cases through te_cpu's stand-ins (the native module and its loader) and
    redirections (TE's CUDA queries, only while TE code runs). Without an importable TE every
    case skips with "transformer_engine not installed: <the import error>".

    How it drives TE: TE_ENV is set before TE is imported (NVTE_FLASH_ATTN=0, NVTE_FUSED_ATTN=0,
    NVTE_UNFUSED_ATTN=1, NVTE_UnfusedDPA_Emulate_FP8=1; the stand-in adds
    NVTE_MASKED_SOFTMAX_FUSION=0), and every call checks TE's backend cache: a call that did not
    run UnfusedDotProductAttention is an error, never a silent test of another backend. TE's
    module-global ALiBi cache is reset before each call, as a fresh process has it (TE deviation
    D4 is the reason; tests/test_te_adapter.py shows D4 itself). The mapping:

    - constructor: num_attention_heads = h, kv_channels = d or (d, dv), num_gqa_groups = hg,
      attention_dropout, qkv_format, attn_mask_type, window_size, attention_type, softmax_scale;
      bottom_right_diagonal, softmax_type, return_max_logit where the installed TE has them.
    - forward: qkv_layout -> qkv_format (TE detects packing from the strides of the q/k/v views);
      everything else by the same name and value (SAME_NAME; attention_mask True = masked out
      in both, not inverted; a (q, kv) mask pair in self attention as TE's one-mask form, its
      query mask): the case's mask type and window go to TE as given, so TE's own
      check_set_window_size, alignment rules and thd check are what the suites judge.
    - softmax_offset ("learnable"): TE has no such forward argument; the module owns a Parameter
      [h], into which the case's offset is loaded (its gradient is the case's dsoftmax_offset).
    - fp8=True, fp8_meta={"recipe": ...}: TE takes FP8 from a context, so the call runs under
      TE's autocast with the recipe translated (te_recipe; fp8_dpa=True). Native TE only: its
      quantizers are native code.

    Skips with a reason (TE cannot express the case): the four mixed-format inference layouts
    (TE takes them only through inference_params); a case needing an argument the installed TE
    lacks (ADDED_IN); CPU cases where the native TE is installed; FP8 through the stand-in.

    Where TE's code departs from its own documentation or from its fused softmax kernel (SPEC
    §7), the case is a TE deviation: suites/te_deviations.py records each (TE lines, reproducer,
    diagnosis, the cases it explains), and known_deviations() names the ones a case meets; the
    suites run such cases as strict expected failures.
    """

    def version(self):
        return distribution_version("transformer_engine")

    name = "transformer_engine"
    # TE checks its arguments with assert statements (its own messages); a few are ValueErrors
    argument_errors = (AssertionError, ValueError)
    WHY = {
        **dict.fromkeys(
            MIXED_LAYOUTS,
            "q and the kv cache in different formats exist in TE only inside its KV cache "
            "(inference_params); DotProductAttention.forward takes one qkv_format",
        ),
        "fp8": "TE's FP8 quantizers and autocast are native code (transformer_engine_torch), "
        "which the CPU stand-in lacks; with the native TE installed the FP8 cases run",
        "validates_arguments": "TE checks its arguments with assert statements and its own "
        "messages (AssertionError: argument_errors), not the ValueErrors this test matches",
        "dropout_ctx": "not mapped: DotProductAttention takes no attention_dropout_ctx but "
        "get_rng_state_tracker (a tracker whose fork() it enters); the adapter passes none",
        "traceable": "through the CPU stand-in TE's CUDA queries are answered by monkeypatched "
        "torch.cuda functions and a TorchFunctionMode while TE code runs; dynamo traces "
        "torch.cuda.current_device() as the real one ('Torch not compiled with CUDA enabled'). "
        "With the native TE the capability is declared (not run on a GPU here)",
        "fp8_state": "not wired: TE keeps FP8 scaling state in fp8_meta['scaling_fwd'] and "
        "['scaling_bwd'] (amax_history [len, n], scale [n], by TE's tensor indices); the adapter "
        "does not read it, having no native TE on the project's GPU machine to check the mapping",
        "capturable": "not declared: TE's own CUDA-graph route is make_graphed_callables, and "
        "no TE was installed on the project's GPU machine to check torch.compile's "
        "reduce-overhead capture of DotProductAttention",
    }

    @property
    def support(self) -> Support:
        """The declaration for the installed TE: its unfused path (dropout, sync-free,
        deterministic: torch's baddbmm, softmax and bmm, no atomics; TE's
        NVTE_ALLOW_NONDETERMINISTIC_ALGO concerns the fused backends, switched off here;
        checked on the CPU stand-in, not on a GPU, where no TE was installed); tracing and FP8
        only with the native TE (the CPU stand-in's redirections are invisible to dynamo, and
        FP8 quantizers are native code); the arguments newer than the installed TE turned away
        (ADDED_IN); CPU cases only through the stand-in. Without TE installed, what the native
        TE declares: every case then skips as this machine's (unavailable_reason), never as
        declined."""
        te, missing = load()
        native = missing is None and not stand_in()
        capabilities = ["dropout", "sync_free", "deterministic", "exact_one_key"]
        if native or te is None:
            capabilities += ["traceable", "fp8"]
        rules = []
        if native:
            rules.append(Rule(
                lambda c: c.device == "cpu", "the native TE is installed; CPU cases run only "
                "through the CPU stand-in (suites/adapters/te_cpu_standin.py), on machines "
                "without CUDA",
            ))  # fmt: skip
        if te is not None:
            takes = accepted(te.DotProductAttention.__init__) | accepted(
                te.DotProductAttention.forward
            )
            for name, feature, needed in (
                ("softmax_type", None, lambda c: c.softmax_type != "vanilla"),
                ("return_max_logit", "max_logit", lambda c: c.return_max_logit),
                ("bottom_right_diagonal", "bottom_right_diagonal",
                 lambda c: c.bottom_right_diagonal is not None),
            ):  # fmt: skip
                if name not in takes:
                    why = f"TE {te_version()}: DotProductAttention has no {name} argument"
                    rules.append(Rule(needed, f"{why} (TE {ADDED_IN[name]}+)", feature))
        return Support(
            layouts=tuple(lay for lay in LAYOUTS if lay not in MIXED_LAYOUTS),
            capabilities=tuple(capabilities), rules=tuple(rules), why=self.WHY,
        )  # fmt: skip

    def unavailable_reason(self, device: str) -> str | None:
        return load()[1]

    def known_deviations(self, case: AttnCase, lengths=None, expected=None, call_kwargs=None):
        """suites/te_deviations.py's entries that explain why TE's result for this case differs
        from the documented one (te_deviations.explain); the fallback outcome only where TE's
        softmax takes its torch fallback (always through the CPU stand-in)."""
        return te_deviations.explain(
            case, lengths=lengths, expected=expected, call_kwargs=call_kwargs,
            fallback_softmax=self.takes_fallback_softmax(case, call_kwargs),
        )  # fmt: skip

    def takes_fallback_softmax(self, case: AttnCase, call_kwargs=None) -> bool:
        """Whether TE's FusedScaleMaskSoftmax takes its torch fallback for the case: asked of
        TE's own is_kernel_available (softmax.py:296-329) with the mask type and mask shape
        its unfused backend passes (backends.py:536-552, 727-729). Always True through the
        stand-in (NVTE_MASKED_SOFTMAX_FUSION=0)."""
        te, missing = load()
        if missing or stand_in() or case.device == "cpu":
            return True
        softmax_mod = sys.modules[
            "transformer_engine.pytorch.attention.dot_product_attention.softmax"
        ]
        sm = softmax_mod.FusedScaleMaskSoftmax(lambda x, m: x)
        sm.input_in_fp16 = case.dtype == "fp16"
        sm.input_in_bf16 = case.dtype == "bf16"
        sm.input_in_float16 = sm.input_in_fp16 or sm.input_in_bf16
        mask_type = te_deviations.te_final_mask_type(case)
        sm.attn_mask_type = mask_type
        sk = case.skv + case.kv_cache_extra + (case.softmax_type != "vanilla")
        user = (call_kwargs or {}).get("attention_mask")
        lead = user.shape[:2] if mask_type == "arbitrary" and torch.is_tensor(user) else None
        if lead is None:
            lead = (case.b, 1) if "padding" in mask_type else (1, 1)
        mask = torch.empty(*lead, case.sq, sk, dtype=torch.bool, device="meta")
        return not sm.is_kernel_available(mask, case.b, case.h, case.sq, sk)

    def _te(self) -> ModuleType:
        te, missing = load()
        if missing:
            raise RuntimeError(missing)
        return te

    def _region(self, case: AttnCase):
        """Where TE code runs: the CPU redirections for CPU cases (stand-in only), else none."""
        return te_cpu.cpu_redirect() if case.device == "cpu" else contextlib.nullcontext()

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        if dropout_ctx is not None:
            raise NotImplementedError(self.declines(needs=("dropout_ctx",))[0].text)
        te = self._te()
        takes = accepted(te.DotProductAttention.__init__)
        with self._region(case):
            module = te.DotProductAttention(**te_init_kwargs(case, scale, dropout, takes))
        return module if case.device == "cpu" else module.to(case.device)

    def call(self, module, case, q, k, v, kwargs):
        te = self._te()
        kwargs = dict(kwargs)
        offset = kwargs.pop("softmax_offset", None)
        fp8, fp8_meta = kwargs.pop("fp8", False), kwargs.pop("fp8_meta", None)
        stand_in_leaves = {}
        if offset is not None:
            if case.softmax_type != "learnable":
                raise ValueError(
                    "transformer_engine: softmax_offset needs softmax_type='learnable'"
                )
            with torch.no_grad():  # TE's module owns the offset: load the case's values into it
                module.softmax_offset.copy_(offset.reshape(-1))
            stand_in_leaves["offset"] = module.softmax_offset
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
        reset_alibi_cache(module)
        with self._region(case), region:
            result = module(q, k, v, **forward)
        _require_unfused(module)
        out, max_logit = result if case.return_max_logit else (result, None)
        return out, max_logit, stand_in_leaves


def _require_unfused(module) -> None:
    """Raise unless TE's backend cache says the last call ran UnfusedDotProductAttention."""
    backends = getattr(sys.modules.get(type(module).__module__), "_attention_backends", None)
    if isinstance(backends, dict) and backends.get("use_unfused_attention") is False:
        ran = [k for k in ("use_flash_attention", "use_fused_attention") if backends.get(k)]
        raise RuntimeError(
            f"transformer_engine ran {ran or 'another backend'}, not UnfusedDotProductAttention, "
            f"although {TE_ENV} were set before it was imported"
        )
