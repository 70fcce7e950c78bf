"""--impl transformer_engine: the CPU stand-in (suites/adapters/te_cpu_standin.py), the deviation
registry (suites/te_deviations.py) and the argument mapping, on the CPU without TE; with TE
2.20.2 installed (requirements-te.txt, .ci/te.sh), TE itself through the stand-in: its results
agree with te_ref where no deviation is recorded, every reproducer still shows its deviation,
and D4 (the ALiBi cache) shows on two calls of one module. Without TE those skip, saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import te_ref
from te_conformance.reports.model import load_report
from te_conformance.suites import te_deviations
from te_conformance.suites.adapters import ADAPTERS
from te_conformance.suites.adapters import te_cpu_standin as te_cpu
from te_conformance.suites.adapters import transformer_engine as te_adapter
from te_conformance.suites.cases import AttnCase, make_inputs, sized
from te_conformance.suites.checks.attention import (
    judge_against_reference,
    known_deviations,
    run_impl,
)
from te_ref.ops import convert_bshd_to_thd, convert_thd_to_bshd

ROOT = Path(__file__).resolve().parents[1]
NO_TE = ROOT / "tests" / "te_fixtures" / "no_te"
ADAPTER = ADAPTERS["transformer_engine"]


def cpu_case(layout, dtype, mask, **kw) -> AttnCase:
    gqa, cross = kw.pop("gqa", 1), kw.pop("cross", False)
    return sized(AttnCase(layout, dtype, mask, device="cpu", **kw), gqa=gqa, cross=cross)


def _te_or_skip():
    te, missing = te_adapter.load()
    if missing:
        pytest.skip(f"needs TE 2.20.2 (requirements-te.txt): {missing}")
    if not te_adapter.stand_in():
        pytest.skip("the native TE is installed: these tests are for the CPU stand-in")
    return te


# ----------------------------------------------------------------------------- the stand-in


def test_stand_in_module_provides_enums_and_conversions_only():
    tex = te_cpu.make_tex()
    assert te_cpu.is_stand_in(tex) and not te_cpu.is_stand_in(torch)
    assert tex.NVTE_Mask_Type.NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK == 5  # fused_attn.h
    assert tex.DType.kBFloat16 == 6 and tex.NVTE_QKV_Layout.NVTE_QKV_Layout_NOT_SET == 26
    assert tex.get_cudnn_version() == 91200
    gemm = tex.generic_gemm  # a native name: a placeholder, recorded as read
    assert tex.placeholders_read == ["generic_gemm"]
    with pytest.raises(NotImplementedError, match=r"transformer_engine_torch\.generic_gemm is "):
        gemm(1, 2)
    with pytest.raises(NotImplementedError, match=r"CommOverlap\.copy_into_buffer"):
        tex.CommOverlap.copy_into_buffer()


def test_stand_in_conversions_equal_te_refs():
    """convert_thd_to_bshd / convert_bshd_to_thd of the stand-in (TE's C++ wrappers, re-done in
    torch) against te_ref's own versions, with a zero-length sequence and trailing tokens."""
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    thd = torch.randn(9, 2, 5)  # 2 tokens past cu[-1]
    bshd = te_cpu.convert_thd_to_bshd(thd, cu, 3, 4)
    assert torch.equal(bshd, convert_thd_to_bshd(thd, cu, 3, 4, compute_dtype=thd.dtype))
    back = te_cpu.convert_bshd_to_thd(bshd, cu, 9)
    assert torch.equal(back, convert_bshd_to_thd(bshd, cu, 9, compute_dtype=thd.dtype))
    assert torch.equal(back[:7], thd[:7]) and not back[7:].any()


def test_cpu_redirect_only_while_inside():
    before = (torch.cuda.is_available, torch.cuda.current_device, torch.cuda.get_device_properties)
    with te_cpu.cpu_redirect():
        assert torch.cuda.is_available() and torch.cuda.current_device() == 0
        assert torch.cuda.get_device_properties(0).major == 9
        t = torch.zeros(3, device="cuda")
        assert t.device.type == "cpu" and t.is_cuda
        assert torch.arange(2, device=torch.cuda.current_device()).device.type == "cpu"
        assert t.to(device="cuda").device.type == "cpu" and t.to("cuda").device.type == "cpu"
    assert not torch.zeros(1).is_cuda
    after = (torch.cuda.is_available, torch.cuda.current_device, torch.cuda.get_device_properties)
    assert after == before
    with pytest.raises(RuntimeError, match="inside"), te_cpu.cpu_redirect():
        raise RuntimeError("inside")
    assert torch.cuda.is_available is before[0]


def test_stand_in_loader_puts_the_module_in_place(monkeypatch):
    monkeypatch.delitem(sys.modules, "transformer_engine_torch", raising=False)
    te_cpu._stand_in_loader("torch")
    assert te_cpu.is_stand_in(sys.modules["transformer_engine_torch"])
    with pytest.raises(FileNotFoundError, match="jax"):
        te_cpu._stand_in_loader("jax")


# ----------------------------------------------------------------------------- the mapping


def test_case_arguments_pass_to_te_as_given():
    """No rewriting: TE's own check_set_window_size, alignment rules and thd check are judged."""
    takes = frozenset({"bottom_right_diagonal", "softmax_type", "return_max_logit"})
    case = cpu_case("thd_thd_thd", "bf16", "causal", window=(-1, 4), bottom_right_diagonal=False)
    init = te_adapter.te_init_kwargs(case, 0.25, 0.0, takes)
    assert init["attn_mask_type"] == "causal" and init["window_size"] == (-1, 4)
    assert init["bottom_right_diagonal"] is False and init["qkv_format"] == "thd"
    kwargs = {"qkv_layout": "thd_thd_thd", "attn_mask_type": "causal", "window_size": (0, -1)}
    assert te_adapter.te_forward_kwargs(case, kwargs) == {
        "qkv_format": "thd", "attn_mask_type": "causal", "window_size": (0, -1),
    }  # fmt: skip
    with pytest.raises(TypeError, match=r"no TE mapping for \['fast_path'\]"):
        te_adapter.te_forward_kwargs(case, {"qkv_layout": "bshd_bshd_bshd", "fast_path": True})
    with pytest.raises(ValueError, match="different formats"):
        te_adapter.te_forward_kwargs(case, {"qkv_layout": "thd_bshd_bshd"})


def test_declared_capabilities():
    assert ADAPTER.argument_errors == (AssertionError, ValueError)
    assert ADAPTERS["te_fast"].argument_errors == (ValueError,)
    assert not ADAPTER.default and "cpu" in ADAPTER.support.devices
    (reason,) = ADAPTER.declines(needs=("validates_arguments",), device="cpu")
    assert "assert statements" in reason.text and reason.feature == "argument_checks"


# ----------------------------------------------------------------------------- the registry


def _explain(case, **kw):
    return tuple(d.id for d in te_deviations.explain(case, **kw))


def test_reason_format():
    assert str(te_deviations.D1) == (
        "TE deviation D1: " + te_deviations.D1.title + " [TE pytorch/attention/"
        "dot_product_attention/utils.py:2068-2071] reproducer: "
        "python -m te_conformance.suites.te_deviations D1"
    )
    assert str(te_deviations.FALLBACK).startswith("TE fallback: fully masked rows")
    assert str(te_deviations.FALLBACK).endswith(
        "reproducer: python -m te_conformance.suites.te_deviations fallback"
    )


def test_predicates_on_the_reproducers():
    one = dict(b=1, h=1, hg=1, d=4, device="cpu")
    assert _explain(AttnCase("bshd_bshd_bshd", "fp32", "causal", sq=5, skv=3, dv=3, **one)) == (
        "D1",
    )
    assert _explain(AttnCase("bshd_bshd_bshd", "fp32", "causal", sq=3, skv=5, dv=5, **one)) == ()
    assert _explain(AttnCase("bshd_bshd_bshd", "fp32", "causal_bottom_right", sq=3, skv=2,
                             dv=2, **one)) == ("fallback",)  # fmt: skip
    d2 = AttnCase("thd_thd_thd", "fp32", "padding", sq=4, skv=4, dv=4, **(one | {"b": 2}))
    assert _explain(d2, lengths=([2, 4], [4, 1])) == ("D2",)
    assert _explain(d2, lengths=([2, 4], [2, 4])) == ()
    # D3: left padding, cross attention, bottom-right: the lengths move
    d3 = AttnCase("bshd_bshd_bshd", "fp32", "padding_causal_bottom_right", sq=3, skv=4, dv=4,
                  padding_from="mask", **one)  # fmt: skip
    mq = torch.tensor([True, False, False]).view(1, 1, 1, 3)
    mkv = torch.tensor([True, False, False, False]).view(1, 1, 1, 4)
    assert _explain(d3, call_kwargs={"attention_mask": (mq, mkv)}) == ("D3",)
    right = (mq.flip(-1), mkv.flip(-1))  # the same counts, right-padded: TE reads them right
    assert _explain(d3, call_kwargs={"attention_mask": right}) == ()
    # D5: a mask given with a causal type; none with no_mask and no window (TE ignores it)
    m = torch.zeros(1, 1, 3, 3, dtype=torch.bool)
    m[..., 0] = True
    causal = AttnCase("bshd_bshd_bshd", "fp32", "causal", sq=3, skv=3, dv=3, **one)
    assert _explain(causal, call_kwargs={"attention_mask": m}) == ("D5",)
    assert _explain(replace(causal, mask_type="no_mask"), call_kwargs={"attention_mask": m}) == ()
    # D6 (+ the fallback's uniform padded rows): padding type, window, ALiBi, bottom-right
    d6 = AttnCase("bshd_bshd_bshd", "fp32", "padding_causal_bottom_right", sq=4, skv=5, dv=5,
                  window=(2, 0), bias_type="alibi", **one)  # fmt: skip
    assert _explain(d6, lengths=([2], [4])) == ("D6", "fallback")
    assert _explain(replace(d6, bias_type="no_bias"), lengths=([2], [4])) == ("fallback",)
    # no fallback where TE's fused softmax kernel would take the case
    assert _explain(replace(d6, bias_type="no_bias"), lengths=([2], [4]),
                    fallback_softmax=False) == ()  # fmt: skip
    # an argument TE asserts on is no deviation (both refuse it)
    assert _explain(replace(causal, window=(-1, 2))) == ()


def test_thd_zero_filled_keys_hide_a_difference():
    """thd: TE's padded keys are zeros. A row whose keys are all padding gives 0 either way
    (uniform over zero V), so a zero-length kv sequence is no visible deviation on its own."""
    case = AttnCase("thd_thd_thd", "fp32", "padding", b=2, sq=4, skv=4, h=1, hg=1, d=4, dv=4,
                    window=(1, 1), device="cpu")  # fmt: skip
    assert _explain(case, lengths=([2, 3], [2, 0]), fallback_softmax=True) == ()


def test_every_deviation_has_its_fields():
    for dev_id, dev in te_deviations.DEVIATIONS.items():
        assert dev.id == dev_id and dev.title and dev.diagnosis and dev.grid and dev.reproducer
        assert ":" in dev.te_lines, dev_id


# ----------------------------------------------------------------------------- TE itself


@pytest.mark.parametrize("dev_id", list(te_deviations.DEVIATIONS))
def test_each_reproducer_still_shows_its_deviation(dev_id):
    """The reproducer's TE grid differs from the documented one (a fixed TE fails here)."""
    _te_or_skip()
    text = te_deviations.reproduce(dev_id)
    if te_deviations.DEVIATIONS[dev_id].reproducer.get("max_logit_dtype"):  # M1: a dtype
        te_part = text.split("documented")[0]
        assert "max_logit torch.float32" not in te_part, f"{dev_id} no longer shows:\n{text}"
        return
    te_part, doc_part = text.split("documented (te_ref, SPEC):")
    te_rows = te_part.split("(batch 0, head 0):")[1].strip()
    doc_rows = doc_part.split("\n\nmax_logit")[0].strip()
    assert te_rows != doc_rows, f"{dev_id} no longer shows:\n{text}"


def test_alibi_cache_d4_shows_without_the_reset(monkeypatch):
    """D4: one module, two calls with the same shapes and other lengths. With the adapter's
    reset before each call TE agrees with te_ref; without it, the second call keeps the first
    call's ALiBi offsets (strict: equal results would mean D4 is gone)."""
    _te_or_skip()
    case = AttnCase("bshd_bshd_bshd", "fp32", "padding", b=1, sq=4, skv=6, h=2, hg=2, d=8,
                    dv=8, bias_type="alibi", device="cpu")  # fmt: skip
    base = make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(1))

    def with_lengths(lq, lkv):
        cu_q, cu_kv = (torch.tensor([0, n], dtype=torch.int32) for n in (lq, lkv))
        kwargs = dict(base.kwargs, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
        return replace(base, kwargs=kwargs, lengths_q=[lq], lengths_kv=[lkv])

    first, second = with_lengths(4, 6), with_lengths(1, 6)
    assert known_deviations(ADAPTER, case, second) == []
    module = ADAPTER.build(case, 8**-0.5)
    run_impl(ADAPTER, module, case, first)
    judge_against_reference(case, second, run_impl(ADAPTER, module, case, second))
    run_impl(ADAPTER, module, case, first)
    monkeypatch.setattr(te_adapter, "reset_alibi_cache", lambda module: None)
    stale = run_impl(ADAPTER, module, case, second)
    with pytest.raises(AssertionError):
        judge_against_reference(case, second, stale)


@pytest.mark.parametrize(
    "case",
    [
        cpu_case("bshd_bshd_bshd", "fp32", "causal", gqa=2),
        cpu_case("sbh3d", "fp32", "no_mask", bias_type="alibi", softmax_type="off-by-one"),
        cpu_case("thd_t2hd", "bf16", "padding_causal", varlen="full"),
        cpu_case("bs3hd", "fp32", "no_mask", softmax_type="learnable", offset_via="param"),
        cpu_case("sbhd_sbhd_sbhd", "fp32", "padding", cross=True, padding_from="mask",
                 bias_type="post_scale_bias", bias_shape="1hss", return_max_logit=True),
    ],  # fmt: skip
    ids=lambda c: c.id,
)
def test_te_agrees_with_te_ref_where_no_deviation_is_recorded(case):
    _te_or_skip()
    inputs = make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert known_deviations(ADAPTER, case, inputs) == []
    module = ADAPTER.build(case, case.d**-0.5)
    judge_against_reference(case, inputs, run_impl(ADAPTER, module, case, inputs, watch=True))


def test_stand_in_runs_only_the_unfused_backend_and_no_native_call():
    _te_or_skip()
    case = cpu_case("bshd_bshd_bshd", "bf16", "causal")
    inputs = make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
    run_impl(ADAPTER, ADAPTER.build(case, 0.25), case, inputs)
    backends = sys.modules[type(ADAPTER.build(case, 0.25)).__module__]._attention_backends
    assert backends["use_unfused_attention"] and not backends["use_fused_attention"]
    assert not torch.cuda.is_available()  # the redirections were undone
    assert ADAPTER.takes_fallback_softmax(case) and not ADAPTER.support.has("fp8")


def test_te_refuses_what_te_ref_refuses_with_an_assertion():
    """TE asserts (argument_errors) where te_ref raises ValueError: thd with a causal type."""
    _te_or_skip()
    case = cpu_case("thd_thd_thd", "fp32", "causal")
    inputs = make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(ADAPTER.argument_errors, match="padding"):
        run_impl(ADAPTER, ADAPTER.build(case, 0.25), case, inputs)
    q = torch.zeros(5, 4, 16)
    with pytest.raises(ValueError):
        te_ref.dot_product_attention(
            q, q, q, qkv_layout="thd_thd_thd", attn_mask_type="causal",
            cu_seqlens_q=torch.tensor([0, 5], dtype=torch.int32),
            cu_seqlens_kv=torch.tensor([0, 5], dtype=torch.int32), max_seqlen_q=5,
            max_seqlen_kv=5,
        )  # fmt: skip


# ----------------------------------------------------------------------------- without TE


def test_without_te_every_case_skips_with_the_import_error(tmp_path):
    """The attention suite under --impl transformer_engine with TE hidden: every case skips.
    What TE's declaration turns away is declined on every machine (the invalid-argument tests:
    TE asserts; the mixed inference layouts); every other case is this machine's (kind
    "environment"): the import error for the CPU cases, no CUDA device for the GPU ones
    (test_core's combinations that no layout can express skip before any adapter is asked, as
    inexpressible)."""
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    paths = [str(NO_TE), str(ROOT), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
        "--te-report", str(out), "--impl", "transformer_engine",
        "suites/conformance/test_attention.py",
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    cases = load_report(out)["cases"]
    reason = (
        "transformer_engine not installed: ImportError: "
        "transformer_engine hidden by tests/te_fixtures/no_te"
    )
    assert len(cases) > 300
    assert all("transformer_engine" in c["nodeid"] for c in cases)
    invalid = AttnCase("bs3hd", "bf16", "causal", hg=2).invalid_reason()
    no_cuda = "no CUDA device on this machine (GPU case)"

    def expected(c):
        if c["skip_reason"] == invalid:
            return "inexpressible", invalid
        if c["skip"]["kind"] == "declined":  # TE's own declaration, whether installed or not
            return "declined", "transformer_engine "
        return "environment", no_cuda if "cuda" in c["nodeid"].rpartition("[")[2] else reason

    wrong = [
        (c["nodeid"], c["outcome"], c["skip_reason"]) for c in cases
        if c["outcome"] != "skipped" or not c["skip_reason"].startswith(expected(c)[1])
        or c["skip"]["kind"] != expected(c)[0]
    ]  # fmt: skip
    assert not wrong, wrong[:5]
    declined = [c for c in cases if c["skip"]["kind"] == "declined"]
    told = ("lacks validates_arguments", "does not support layout", "lacks exact_one_key on cuda")
    assert declined and all(any(t in c["skip_reason"] for t in told) for c in declined), sorted(
        {c["skip_reason"][:120] for c in declined}
    )
