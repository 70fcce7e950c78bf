"""torch.compile and CUDA-graph conformance of the non-FP8 attention path (SPEC §3-4).

GPU: torch.compile(fullgraph=True, mode="reduce-overhead"): forward and backward replayed from
CUDA graphs, checked every iteration against eager and te_ref float64; no graph breaks, no
CUDA-graph skips, no recompiles after warm-up, and a positive signal that graphs were replayed.
CPU: fullgraph tracing with inductor (the five contract layouts) and aot_eager (a broad matrix).
"""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import replace

import pytest
import torch

from te_conformance.reports import record
from te_conformance.suites import devices, features
from te_conformance.suites.adapters import selected
from te_conformance.suites.cases import AttnCase, make_inputs, sized
from te_conformance.suites.checks import contracts
from te_conformance.suites.checks.attention import (
    judge_against_reference,
    prepare,
    prepare_run,
    run_impl,
)
from te_conformance.suites.checks.numerics import assert_bitwise_equal
from te_ref.layouts import CONTRACT_LAYOUTS, LAYOUTS

ITERATIONS = 4  # warm-up, record, replay, replay (the last one profiled)
# Graphs dynamo may compile over DYNAMIC_LENGTHS with dynamic=True: one, as the lengths are dynamic
# from the first call. Multiples of 32 and 64 sit among odd lengths, so that a guard on a length
# (a branch on s % 64, on s being even) makes a second graph.
DYNAMIC_COMPILE_BOUND = 1
DYNAMIC_LENGTHS = (33, 41, 57, 64, 77, 96, 128, 35)

VARIANTS = {
    # name -> (device, torch.compile kwargs, bitwise equal to eager?)
    "cudagraph": ("cuda", {"mode": "reduce-overhead"}, False),
    "cudagraphs_backend": ("cuda", {"backend": "cudagraphs"}, True),  # no codegen: bitwise
    "inductor": ("cpu", {"backend": "inductor"}, False),
    "aot_eager": ("cpu", {"backend": "aot_eager"}, True),
}


def _extras(device: str) -> list[AttnCase]:
    """Window, alibi, bias, GQA, MLA, sink softmax, cross attention and THD inference layouts."""

    def c(layout, dtype, mask, gqa=1, mla=False, cross=False, **kw):
        dtype = dtype if device == "cuda" else "fp32"
        case = AttnCase(layout, dtype, mask, device=device, **kw)
        return sized(case, gqa=gqa, mla=mla, cross=cross)

    return [
        c("bshd_bshd_bshd", "bf16", "causal", window=(16, 0)),
        c("sbhd_sbhd_sbhd", "bf16", "no_mask", window=(8, 8)),
        c("sbh3d", "bf16", "causal", bias_type="alibi"),
        c("bs3hd", "fp16", "padding", bias_type="post_scale_bias", bias_shape="1hss"),
        c("bshd_bshd_bshd", "bf16", "padding_causal", gqa=4),
        c("thd_thd_thd", "bf16", "padding_causal", gqa=2),
        c("bshd_bshd_bshd", "bf16", "causal", mla=True),
        c("sbh3d", "bf16", "causal", softmax_type="off-by-one"),
        c("bs3hd", "bf16", "no_mask", softmax_type="learnable", offset_via="param"),
        c("bshd_bshd_bshd", "fp16", "padding", cross=True, padding_from="mask"),
        c("sbhd_sbhd_sbhd", "bf16", "causal_bottom_right", cross=True, return_max_logit=True),
        c("thd_bshd_bshd", "bf16", "padding_causal_bottom_right", kv_cache_extra=9),
        c("thd_sbhd_sbhd", "fp16", "padding_causal_bottom_right", gqa=2, kv_cache_extra=9),
    ]


def _cases() -> list[tuple[str, AttnCase]]:
    """(variant, case): the GPU matrix under reduce-overhead, the CPU tracing matrix."""
    out = []
    for layout in CONTRACT_LAYOUTS:
        for dtype in ("bf16", "fp16"):
            thd = LAYOUTS[layout].q_format == "thd"  # a thd q takes the padding types only
            for mask in (
                ("padding_causal", "padding") if thd else ("causal", "padding_causal", "no_mask")
            ):
                out.append(("cudagraph", sized(AttnCase(layout, dtype, mask))))
        out.append(("cudagraphs_backend", sized(AttnCase(layout, "bf16", "padding_causal"))))
    out += [("cudagraph", case) for case in _extras("cuda")]
    for layout in CONTRACT_LAYOUTS:
        out.append(("inductor", sized(AttnCase(layout, "fp32", "padding_causal", device="cpu"))))
    for layout in sorted(LAYOUTS):
        thd = LAYOUTS[layout].q_format == "thd"
        for mask in ("padding_causal" if thd else "causal", "padding_causal_bottom_right"):
            extra = 5 if LAYOUTS[layout].q_format == "thd" != LAYOUTS[layout].kv_format else 0
            case = AttnCase(layout, "fp32", mask, device="cpu", kv_cache_extra=extra)
            out.append(("aot_eager", sized(case)))
    out += [("aot_eager", case) for case in _extras("cpu")]
    return out


def _params(config):
    params = []
    for adapter in selected(config):
        for variant, case in _cases():
            marks = [pytest.mark.gpu] if case.device == "cuda" else []
            params.append(
                pytest.param(
                    adapter, variant, case, id=f"{case.id}-{adapter.name}.{variant}", marks=marks
                )  # fmt: skip
            )
    return params


def pytest_generate_tests(metafunc):
    if {"adapter", "variant", "case"} <= set(metafunc.fixturenames):
        metafunc.parametrize("adapter,variant,case", _params(metafunc.config))


def _compile(module, variant, **extra):
    _, kwargs, _ = VARIANTS[variant]
    return torch.compile(module, fullgraph=True, **kwargs, **extra)


def _uses_cudagraphs(variant: str) -> bool:
    return VARIANTS[variant][0] == "cuda"


def _needs(variant: str) -> tuple[str, str]:
    """(the capability a variant needs, the feature it is about): CUDA-graph capture for the
    CUDA-graph variants, tracing for the others."""
    if _uses_cudagraphs(variant):
        return "capturable", "cuda_graphs"
    return "traceable", "compile"


def test_compiled(adapter, variant, case):
    """fullgraph compile, >= 3 iterations of fresh inputs, each vs eager and vs te_ref; then no
    graph breaks, no CUDA-graph skips, no recompiles, and graphs replayed for fwd and bwd."""
    need, feature = _needs(variant)
    features.record_features(feature)
    seed = zlib.crc32(case.id.encode()) + 1
    # the case as the adapter runs it: max_logit left out where it returns none (not_judged)
    case, _, base = prepare_run(adapter, case, f"{adapter.name}.{variant}", needs=(need,))
    contracts.reset_compile_state()
    module = adapter.build(case, case.d**-0.5)
    compiled = _compile(module, variant)
    rng = torch.Generator().manual_seed(seed)
    launches = None
    for it in range(ITERATIONS):
        inputs = base.with_fresh_values(rng)
        eager = run_impl(adapter, module, case, inputs)
        stance = (
            contextlib.nullcontext() if it == 0 else torch.compiler.set_stance("fail_on_recompile")
        )
        result = {}

        def step(inputs=inputs, result=result):
            if _uses_cudagraphs(variant):
                torch.compiler.cudagraph_mark_step_begin()
            result["comp"] = run_impl(adapter, compiled, case, inputs, watch=True)

        with stance:
            if it == ITERATIONS - 1 and _uses_cudagraphs(variant):
                launches = contracts.count_graph_launches(step)
            else:
                step()
        comp = result["comp"]
        judge_against_reference(case, inputs, comp)
        diffs = {"out": (comp[0].float() - eager[0].float()).abs().max().item()}
        for name, g in comp[2].items():
            diffs[f"d{name}"] = (g.float() - eager[2][name].float()).abs().max().item()
        record.case(compiled_vs_eager_max_abs_diff=diffs)
        if VARIANTS[variant][2]:  # no re-association happens: eager bit for bit
            assert_bitwise_equal("compiled out vs eager", comp[0], eager[0])
            for name, g in comp[2].items():
                assert_bitwise_equal(f"compiled d{name} vs eager", g, eager[2][name])
    record.counters(**contracts.compile_counters(), graph_launches=launches or 0)
    contracts.assert_no_graph_breaks()
    if _uses_cudagraphs(variant):
        contracts.assert_no_cudagraph_skips()
        contracts.assert_graphs_replayed(launches)


@pytest.mark.per_adapter(
    layout=("bshd_bshd_bshd", "thd_thd_thd", "sbh3d"), device_name=devices.device_params()
)
def test_dynamic_shapes(adapter, layout, device_name):
    """dynamic=True over eight sequence lengths: correct every time, at most
    DYNAMIC_COMPILE_BOUND compiled graphs (a static compile would need eight)."""
    variant = "cudagraph" if device_name == "cuda" else "aot_eager"
    dtype = "bf16" if device_name == "cuda" else "fp32"
    base = sized(AttnCase(layout, dtype, "padding_causal", device=device_name))
    impl = f"{adapter.name}.{variant}.dynamic"
    need, feature = _needs(variant)
    features.record_features(feature)
    prepare(adapter, base, impl, needs=(need,))
    contracts.reset_compile_state()
    module = adapter.build(base, base.d**-0.5)
    compiled = _compile(module, variant, dynamic=True)
    for s in DYNAMIC_LENGTHS:
        case = replace(base, sq=s, skv=s)
        inputs = make_inputs(case, torch.device(device_name), torch.Generator().manual_seed(s))
        if _uses_cudagraphs(variant):
            torch.compiler.cudagraph_mark_step_begin()
        judge_against_reference(case, inputs, run_impl(adapter, compiled, case, inputs))
    stats = contracts.compile_counters()
    record.counters(**stats)
    contracts.assert_no_graph_breaks()
    assert 1 <= stats["unique_graphs"] <= DYNAMIC_COMPILE_BOUND, (
        f"{stats['unique_graphs']} compiled graphs over {len(DYNAMIC_LENGTHS)} lengths "
        f"(bound {DYNAMIC_COMPILE_BOUND}): a guard on a sequence length recompiles"
    )


