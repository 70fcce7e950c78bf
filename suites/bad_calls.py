"""The module's bad calls, as data: each breaks exactly one argument rule, with the exception and
the message the rule raises (te_fast's, which te_ref shares where the standard has the rule).

STANDARD_PROBLEMS are rules of the standard (SPEC §1-2, TE's checks): every adapter that declares
validates_arguments must refuse them (suites/conformance/test_bad_input.py). TE_FAST_PROBLEMS are
te_fast's own (its constructor, attributes set after construction, its FP8 rules, rules te_ref
lacks): suites/te_fast/test_argument_checks.py."""

from __future__ import annotations

import torch

from te_conformance.suites.cases import AttnCase
from te_fast.fp8 import CurrentScaling, DelayedScaling


def module_problems(device):
    """problem -> (module constructor kwargs, (q, k, v), forward kwargs, exception, message,
    whether te_ref has the same rule). Each breaks exactly one rule of te_fast/_arguments.py,
    te_fast/attention.py or te_fast/fp8.py."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=g).to(device)

    q, kv = randn(2, 5, 4, 8), randn(2, 5, 2, 8)
    t, t2 = randn(5, 4, 8), randn(5, 2, 8)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device=device)
    cu2 = torch.tensor([0, 1, 5], dtype=torch.int32, device=device)  # lengths 1, 4
    pad = torch.zeros(2, 1, 1, 5, dtype=torch.bool, device=device)

    def bad_batch(*shape):  # a bool mask of this shape, one position masked
        mask = torch.zeros(shape, dtype=torch.bool, device=device)
        mask[..., 0] = True
        return mask

    base = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="no_mask")
    thd = dict(qkv_layout="thd_thd_thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=3,
               max_seqlen_kv=3, attn_mask_type="padding")  # fmt: skip
    qkv = (q, kv, kv)
    fp8 = {"recipe": DelayedScaling()}
    V = ValueError
    return {
        # constructor
        "ctor_softmax_type": (dict(softmax_type="sink"), qkv, base, V,
                              "unknown softmax_type 'sink'; expected one of", False),
        "ctor_attention_type": (dict(attention_type="both"), qkv, base, V,
                                "attention_type must be 'self' or 'cross', got 'both'", False),
        "ctor_dropout": (dict(attention_dropout=1.0), qkv, base, V,
                         r"attention_dropout must be in \[0, 1\), got 1.0", False),
        "ctor_score_chunk_bytes": (dict(score_chunk_bytes=0), qkv, base, V,
                                   "score_chunk_bytes must be a positive int or None, got 0",
                                   False),
        # the resolved call (te_ref has each of these rules, with the same message)
        "unknown_layout": ({}, qkv, dict(base, qkv_layout="bshd_bshd"), V,
                           "unknown qkv_layout 'bshd_bshd'; expected one of", True),
        "unknown_mask": ({}, qkv, dict(base, attn_mask_type="slide"), V,
                         "unknown attn_mask_type 'slide'; expected one of", True),
        "unknown_bias": ({}, qkv, dict(base, core_attention_bias_type="bias"), V,
                         "unknown core_attention_bias_type 'bias'; expected one of", True),
        "module_softmax_type": ({"_softmax_type": "sink"}, qkv, base, V,
                                "unknown softmax_type 'sink'; expected one of", True),
        "module_attention_type": ({"_attention_type": "both"}, qkv, base, V,
                                  "attention_type must be 'self' or 'cross'", True),
        "q_rank": ({}, (q[0], kv, kv), base, V, r"query_layer in bshd must be 4-D, got shape "
                   r"\(5, 4, 8\)", True),
        "k_rank": ({}, (q, kv[0], kv), base, V, "key_layer in bshd must be 4-D", True),
        "v_rank": ({}, (t, t2, t2[None]), dict(thd, cu_seqlens_kv=cu), V,
                   "value_layer in thd must be 3-D", True),
        "head_dims": ({}, (q, kv[..., :4], kv), base, V,
                      "query and key head dims differ: 8 vs 4", True),
        "kv_disagree": ({}, (q, kv, kv[:, :4]), base, V, r"key_layer \(2, 5, 2, 8\) and "
                        r"value_layer \(2, 4, 2, 8\) must agree in everything but the head dim",
                        True),
        "heads": ({}, (q, randn(2, 5, 3, 8), randn(2, 5, 3, 8)), base, V,
                  r"query heads \(4\) must be a multiple of key/value heads \(3\)", True),
        "dtypes": ({}, (q, kv.double(), kv.double()), base, V,
                   "query/key/value dtypes differ: torch.float32, torch.float64", True),
        # te_fast takes its ops' three dtypes; te_ref float64 too (its golden answer's inputs)
        "q_int64": ({}, (q.long(), kv.long(), kv.long()), base, V,
                    r"query_layer must have dtype torch.float16, torch.bfloat16,? .*or "
                    r"torch.float(32|64) \(key_layer and value_layer share it\), got torch.int64 "
                    r"\(2, 5, 4, 8\)", True),
        "batches": ({}, (q, kv[:1], kv[:1]), base, V,
                    r"query batch \(2\) and key/value batch \(1\) differ", True),
        "needs_cu_q": ({}, (t, t2, t2), dict(thd, cu_seqlens_q=None), V,
                       r"qkv_layout 'thd_thd_thd' needs cu_seqlens_q \(int32 \[b \+ 1\]\)", True),
        "needs_cu_kv": ({}, (t, t2, t2), dict(thd, cu_seqlens_kv=None), V,
                        r"qkv_layout 'thd_thd_thd' needs cu_seqlens_kv \(int32", True),
        "needs_cache_lengths": ({}, (t, kv, kv), dict(thd, qkv_layout="thd_bshd_bshd",
                                cu_seqlens_kv=None), V,
                                "needs cu_seqlens_kv: the filled length of each sequence", True),
        "cu_not_tensor": ({}, (t, t2, t2), dict(thd, cu_seqlens_q=[0, 3, 5]), V,
                          r"cu_seqlens_q must be an int32 tensor of shape \[b \+ 1\], got list",
                          True),
        "cu_int64": ({}, (t, t2, t2), dict(thd, cu_seqlens_q=cu.long()), V,
                     r"cu_seqlens_q must be an int32 tensor of shape \[b \+ 1\], got torch.int64",
                     True),
        "cu_float": ({}, (t, t2, t2), dict(thd, cu_seqlens_kv=cu.float()), V,
                     r"cu_seqlens_kv must be an int32 tensor of shape \[b \+ 1\], got "
                     "torch.float32", True),
        "cache_cu_shape": ({}, (t, kv, kv), dict(thd, qkv_layout="thd_bshd_bshd",
                           cu_seqlens_kv=cu[:2]), V,
                           r"cu_seqlens_kv must have shape \[b \+ 1\] = \[3\], got \(2,\)", True),
        "max_seqlen_missing": ({}, (t, t2, t2), dict(thd, max_seqlen_q=None), V,
                               "max_seqlen_q is required for the thd format of query_layer",
                               True),
        "max_seqlen_negative": ({}, (t, t2, t2), dict(thd, max_seqlen_kv=-1), V,
                                "max_seqlen_kv must be a non-negative plain int, got -1", True),
        "max_seqlen_tensor": ({}, (t, t2, t2), dict(thd, max_seqlen_q=torch.tensor(3)), V,
                              "max_seqlen_q must be a non-negative plain int, got tensor", True),
        # a sequence longer than max_seqlen: the module names its argument, not the op
        # (CUDA: under TE_FAST_DEBUG_CHECKS=1, VALUE_PROBLEMS)
        "max_seqlen_q_short": ({}, (t, t2, t2), dict(thd, max_seqlen_q=2), V,
                               r"max_seqlen_q must be at least the longest sequence of "
                               r"cu_seqlens_q, got max_seqlen_q = 2 < 3, the length of sequence 0",
                               True),
        "max_seqlen_kv_short": ({}, (t, t2, t2), dict(thd, cu_seqlens_kv=cu2, max_seqlen_kv=3), V,
                                r"max_seqlen_kv must be at least the longest sequence of "
                                r"cu_seqlens_kv, got max_seqlen_kv = 3 < 4, the length of "
                                r"sequence 1", True),
        "padding_no_lengths": ({}, qkv, dict(base, attn_mask_type="padding"), V,
                               "attn_mask_type='padding' needs the sequence lengths", True),
        "padding_cross_no_cu_kv": ({}, (q, kv[:, :3], kv[:, :3]),
                                   dict(base, attn_mask_type="padding", cu_seqlens_q=cu), V,
                                   "cross attention with padding needs cu_seqlens_kv as well",
                                   True),
        "padding_cu_shape": ({}, qkv, dict(base, attn_mask_type="padding",
                             cu_seqlens_q=cu[:2]), V,
                             r"cu_seqlens_q must have shape \[b \+ 1\] = \[3\]", True),
        "padding_mask_not_pair": ({}, (q, kv[:, :3], kv[:, :3]),
                                  dict(base, attn_mask_type="padding", attention_mask=pad), V,
                                  r"sq \(5\) != skv \(3\): padding needs attention_mask as a pair",
                                  True),
        "padding_mask_triple": ({}, (q, kv[:, :3], kv[:, :3]),
                                dict(base, attn_mask_type="padding",
                                     attention_mask=(pad, pad, pad)), V,
                                r"attention_mask for cross attention is a pair", True),
        "padding_mask_dtype": ({}, qkv, dict(base, attn_mask_type="padding",
                               attention_mask=pad.float()), V,
                               r"padding attention_mask \(q\) must be torch.bool \[2, 1, 1, 5\], "
                               r"got torch.float32 \(2, 1, 1, 5\)", True),
        "padding_mask_int32": ({}, qkv, dict(base, attn_mask_type="padding",
                               attention_mask=pad.int()), V,
                               r"padding attention_mask \(q\) must be torch.bool \[2, 1, 1, 5\], "
                               r"got torch.int32 \(2, 1, 1, 5\)", True),
        "padding_mask_shape": ({}, qkv, dict(base, attn_mask_type="padding",
                               attention_mask=pad[..., :4]), V,
                               r"padding attention_mask \(q\) must be torch.bool \[2, 1, 1, 5\], "
                               r"got torch.bool \(2, 1, 1, 4\)", True),
        "padding_mask_not_tensor": ({}, qkv, dict(base, attn_mask_type="padding",
                                    attention_mask=[[False] * 5] * 2), V,
                                    r"padding attention_mask \(q\) must be torch.bool "
                                    r"\[2, 1, 1, 5\], got list", True),
        "arbitrary_no_mask": ({}, qkv, dict(base, attn_mask_type="arbitrary"), V,
                              "attn_mask_type='arbitrary' needs attention_mask: a bool tensor",
                              True),
        "arbitrary_float_mask": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                                 attention_mask=torch.zeros(2, 4, 5, 5, device=device)), V,
                                 r"attention_mask for attn_mask_type='arbitrary' must be "
                                 r"torch.bool \(True = masked\), got torch.float32 "
                                 r"\(2, 4, 5, 5\)", True),
        "arbitrary_shape": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                            attention_mask=pad.expand(2, 1, 5, 5)[:, :, :, :4]), V,
                            r"does not broadcast to \[b, h, sq, skv\] = \[2, 4, 5, 5\]", True),
        # a batch that is neither 1 nor b (3 for b = 2), for each argument with a batch axis
        "arbitrary_mask_batch": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                                 attention_mask=bad_batch(3, 4, 5, 5)), V,
                                 r"attention_mask of shape \(3, 4, 5, 5\) does not broadcast to "
                                 r"\[b, h, sq, skv\] = \[2, 4, 5, 5\]", True),
        "arbitrary_mask_batch_1h": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                                    attention_mask=bad_batch(3, 1, 5, 5)), V,
                                    r"attention_mask of shape \(3, 1, 5, 5\) does not broadcast",
                                    True),
        "padding_mask_batch": ({}, qkv, dict(base, attn_mask_type="padding",
                               attention_mask=bad_batch(3, 1, 1, 5)), V,
                               r"padding attention_mask \(q\) must be torch.bool \[2, 1, 1, 5\], "
                               r"got torch.bool \(3, 1, 1, 5\)", True),
        "padding_kv_mask_batch": ({}, (q[:, :3], kv, kv),
                                  dict(base, attn_mask_type="padding",
                                       attention_mask=(pad[..., :3], bad_batch(3, 1, 1, 5))), V,
                                  r"padding attention_mask \(kv\) must be torch.bool "
                                  r"\[2, 1, 1, 5\], got torch.bool \(3, 1, 1, 5\)", True),
        "bias_batch": ({}, qkv, dict(base, core_attention_bias_type="post_scale_bias",
                       core_attention_bias=randn(3, 4, 5, 5)), V,
                       r"core_attention_bias must have shape \[b\|1, h\|1, sq\|1, skv\] = "
                       r"\[2\|1, 4\|1, 5\|1, 5\], got \(3, 4, 5, 5\)", True),
        "slopes_batch": ({}, qkv, dict(base, core_attention_bias_type="alibi",
                         alibi_slopes=randn(3, 4)), V,
                         r"alibi_slopes must have shape \[4\] or \[2, 4\], got \(3, 4\)", True),
        "arbitrary_rank": ({}, qkv, dict(base, attn_mask_type="arbitrary",
                           attention_mask=pad[0, 0]), V, r"attention_mask must be 4-D, got "
                           r"\(1, 5\)", True),
        "mask_with_causal": ({}, qkv, dict(base, attn_mask_type="causal", attention_mask=pad), V,
                             "attention_mask is only used with padding\\* and 'arbitrary' mask "
                             "types, not 'causal'", True),
        "thd_with_mask": ({}, (t, t2, t2), dict(thd, attention_mask=pad), V,
                          "thd layouts take sequence lengths from cu_seqlens, not "
                          "attention_mask", True),
        "bias_missing": ({}, qkv, dict(base, core_attention_bias_type="post_scale_bias"), V,
                         "core_attention_bias_type='post_scale_bias' needs core_attention_bias",
                         True),
        "bias_shape": ({}, qkv, dict(base, core_attention_bias_type="pre_scale_bias",
                       core_attention_bias=randn(2, 4, 5, 4)), V,
                       r"core_attention_bias must have shape \[b\|1, h\|1, sq\|1, skv\] = "
                       r"\[2\|1, 4\|1, 5\|1, 5\], got \(2, 4, 5, 4\)", True),
        # TE's fused attention: "attn_bias tensor must have the same dtype as q and kv"
        # (cpp_extensions/fused_attn.py:340-344); its unfused path casts or fails (SEMANTICS.md)
        "bias_dtype": ({}, (q.half(), kv.half(), kv.half()),
                       dict(base, core_attention_bias_type="post_scale_bias",
                            core_attention_bias=randn(1, 4, 5, 5)), V,
                       r"core_attention_bias must have the dtype of query_layer, torch.float16, "
                       r"got torch.float32 \(1, 4, 5, 5\)", True),
        "bias_without_type": ({}, qkv, dict(base, core_attention_bias=randn(1, 1, 5, 5)), V,
                              "core_attention_bias given with core_attention_bias_type="
                              "'no_bias'", True),
        "slopes_without_alibi": ({}, qkv, dict(base, alibi_slopes=randn(4)), V,
                                 "alibi_slopes given without core_attention_bias_type='alibi'",
                                 True),
        "slopes_shape": ({}, qkv, dict(base, core_attention_bias_type="alibi",
                         alibi_slopes=randn(3)), V,
                         r"alibi_slopes must have shape \[4\] or \[2, 4\], got \(3,\)", True),
        "learnable_without_offset": (dict(softmax_type="learnable"), qkv, base, V,
                                     "softmax_type='learnable' needs softmax_offset", True),
        "offset_with_vanilla": ({}, qkv, dict(base, softmax_offset=randn(4)), V,
                                "softmax_offset given with softmax_type='vanilla'", True),
        "offset_shape": (dict(softmax_type="learnable"), qkv,
                         dict(base, softmax_offset=randn(2)), V,
                         r"softmax_offset must have shape \[4\] or \[1, 4, 1, 1\], got \(2,\)",
                         True),
        "window_not_pair": ({}, qkv, dict(base, window_size=3), V,
                            "window_size must be a pair of ints, got 3", True),
        # window_size as TE 2.20.2's check_set_window_size takes it (utils.py:2992-3034)
        "window_negative": ({}, qkv, dict(base, window_size=(-2, 0)), V,
                            r"window_size=\(-2, 0\) is not valid for attn_mask_type='no_mask': "
                            r"use \(-1, -1\) or \(>=0, >=0\)", True),
        "window_one_side": ({}, qkv, dict(base, window_size=(0, -1)), V,
                            r"window_size=\(0, -1\) is not valid for attn_mask_type='no_mask'",
                            True),
        "window_conflict": ({}, qkv, dict(base, attn_mask_type="causal", window_size=(-1, 3)), V,
                            r"window_size=\(-1, 3\) conflicts with attn_mask_type='causal': "
                            r"causal types take \(-1, 0\) or \(>=0, 0\)", True),
        # thd takes the padding types only (TE 2.20.2 dot_product_attention.py:2449-2452)
        "thd_causal": ({}, (t, t2, t2), dict(thd, attn_mask_type="causal"), V,
                       "attn_mask_type='causal' is not valid for qkv_layout 'thd_thd_thd': a thd "
                       "q takes padding, padding_causal or padding_causal_bottom_right", True),
        # FP8 (te_fast's own)
        "fp8_output_without_fp8": ({}, qkv, dict(base, fp8_output=True, fp8_meta=fp8), V,
                                   "fp8_output=True needs fp8=True", False),
        "fp8_without_recipe": ({}, qkv, dict(base, fp8=True), V,
                               "fp8=True needs fp8_meta=", False),
        "fp8_bad_recipe": ({}, qkv, dict(base, fp8=True, fp8_meta={"recipe": "hybrid"}), V,
                           r"fp8_meta\['recipe'\] must be te_fast.fp8.DelayedScaling or "
                           "CurrentScaling, got str", False),
        "fp8_unsupported": ({}, qkv, dict(base, fp8=True, fp8_meta={"recipe": CurrentScaling()},
                            core_attention_bias_type="post_scale_bias",
                            core_attention_bias=randn(1, 1, 5, 5)), NotImplementedError,
                            r"te_fast FP8 attention does not support \[\"core_attention_bias_"
                            "type='post_scale_bias'\"\\]", False),
    }  # fmt: skip


MODULE_PROBLEMS = list(module_problems("meta"))


def _standard(problem: str) -> bool:
    """Whether any implementation must refuse the problem: te_ref has the rule and the call
    needs no te_fast constructor argument but softmax_type (an AttnCase field)."""
    ctor, _, _, _, _, shared = module_problems("meta")[problem]
    return shared and not set(ctor) - {"softmax_type"}


STANDARD_PROBLEMS = [p for p in MODULE_PROBLEMS if _standard(p)]
TE_FAST_PROBLEMS = [p for p in MODULE_PROBLEMS if not _standard(p)]


# Rules on cu_seqlens values: checked by the conversion op, on CUDA only under
# TE_FAST_DEBUG_CHECKS=1 (without it the rows are NaN-poisoned, with no host sync).
VALUE_PROBLEMS = ("max_seqlen_q_short", "max_seqlen_kv_short")




def adapter_call(adapter, problem, device):
    """The problem's call through the adapter's build and call: the module's configuration from
    an AttnCase, the bad part in the forward arguments."""
    ctor, (q, k, v), kwargs, _, _, _ = module_problems(device)[problem]
    softmax_type = ctor.get("softmax_type", "vanilla")
    case = AttnCase("bshd_bshd_bshd", "fp32", "no_mask", device=device.type, b=2, sq=5, skv=5,
                    h=4, hg=2, d=8, dv=8, softmax_type=softmax_type)  # fmt: skip
    return lambda: adapter.call(adapter.build(case, 0.35), case, q, k, v, dict(kwargs))


# the problems of module_problems whose argument has a batch axis of 3 where b = 2
BATCH_PROBLEMS = (
    "arbitrary_mask_batch", "arbitrary_mask_batch_1h", "padding_mask_batch",
    "padding_kv_mask_batch", "bias_batch", "slopes_batch",
)  # fmt: skip
