"""--impl transformer_engine: the exact arguments TE's DotProductAttention receives, checked on
the CPU against a recording stand-in (tests/te_fixtures/fake_te), and the skips without TE."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import te_fast.fp8
from reports.model import load_report
from suites.adapters import ADAPTERS
from suites.adapters import transformer_engine as te_adapter
from suites.cases import AttnCase, make_inputs, sized

ROOT = Path(__file__).resolve().parents[1]
FAKE_TE = ROOT / "tests" / "te_fixtures" / "fake_te"
NO_TE = ROOT / "tests" / "te_fixtures" / "no_te"
ADAPTER = ADAPTERS["transformer_engine"]
SCALE = 0.25  # d = 16 on the CPU sizes


def _forget_te() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "transformer_engine"]:
        del sys.modules[name]


@pytest.fixture
def te(monkeypatch):
    """The stand-in as transformer_engine.pytorch, loaded by the adapter from a clean slate (no
    TE module imported, no NVTE_* variable set: the adapter must set them itself)."""
    for key in te_adapter.TE_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.syspath_prepend(str(FAKE_TE))
    monkeypatch.setattr(te_adapter, "_loaded", None)
    _forget_te()
    module, missing = te_adapter.load()
    assert missing is None, missing
    yield module
    _forget_te()


def run(te, case: AttnCase, dropout: float = 0.0, **extra):
    """Build and call the adapter on the case's real inputs: (init kwargs, forward record, the
    kwargs of our call, the adapter's result, the module)."""
    inputs = make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
    q, k, v, tensors = inputs.views(inputs.leaves, case)
    kwargs = {**inputs.kwargs, **tensors, **extra}
    te.CALLS.clear()
    module = ADAPTER.build(case, SCALE, dropout)
    result = ADAPTER.call(module, case, q, k, v, kwargs)
    inits = [c["init"] for c in te.CALLS if "init" in c]
    forwards = [c for c in te.CALLS if "forward" in c]
    assert len(inits) == len(forwards) == 1, te.CALLS
    assert all(a is b for a, b in zip(forwards[0]["qkv"], (q, k, v))), "q/k/v must pass as is"
    return inits[0], forwards[0], kwargs, result, module


def same(got: dict, expected: dict) -> None:
    """Equal keyword arguments; tensors (and tuples of them) must be the very objects."""
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for key, want in expected.items():
        have = got[key]
        if isinstance(want, torch.Tensor) or (
            isinstance(want, tuple) and want and isinstance(want[0], torch.Tensor)
        ):
            pairs = zip(have, want) if isinstance(want, tuple) else [(have, want)]
            assert isinstance(have, type(want)) and all(a is b for a, b in pairs), key
        else:
            assert have == want and type(have) is type(want), (key, have, want)


def init(**overrides) -> dict:
    """The constructor arguments of a plain CPU-sized case, with overrides."""
    base = dict(
        num_attention_heads=4, kv_channels=16, num_gqa_groups=4, attention_dropout=0.0,
        qkv_format="bshd", attn_mask_type="causal", window_size=None, attention_type="self",
        softmax_scale=SCALE, bottom_right_diagonal=None, softmax_type="vanilla",
        return_max_logit=False,
    )  # fmt: skip
    return base | overrides


def cpu_case(layout, dtype, mask, **kw) -> AttnCase:
    gqa, cross = kw.pop("gqa", 1), kw.pop("cross", False)
    return sized(AttnCase(layout, dtype, mask, device="cpu", **kw), gqa=gqa, cross=cross)


# ----------------------------------------------------------------------------- loading


def test_unfused_backend_is_forced_before_te_is_imported(te):
    assert te.ENV_AT_IMPORT == te_adapter.TE_ENV == {
        "NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1",
        "NVTE_UnfusedDPA_Emulate_FP8": "1",
    }  # fmt: skip


def test_te_imported_earlier_without_the_variables_is_refused(monkeypatch):
    for key in te_adapter.TE_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.syspath_prepend(str(FAKE_TE))
    monkeypatch.setattr(te_adapter, "_loaded", None)
    _forget_te()
    try:
        import transformer_engine.pytorch  # noqa: F401  (someone imported TE first)

        te, missing = te_adapter.load()
        assert te is None and missing.startswith(
            "transformer_engine was imported before this adapter could force its unfused backend"
        ), missing
    finally:
        _forget_te()


def test_a_call_that_did_not_run_the_unfused_backend_is_an_error(te, monkeypatch):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "1")  # the stand-in now reports FusedAttention
    with pytest.raises(RuntimeError, match=r"ran \['use_fused_attention'\], not Unfused"):
        run(te, cpu_case("bshd_bshd_bshd", "bf16", "causal"))


# ----------------------------------------------------------------------------- the mapping


@pytest.mark.parametrize("layout", ["bshd_bshd_bshd", "sbhd_sbhd_sbhd", "bs3hd", "sbh3d"])
def test_padded_formats_and_packing(te, layout):
    case = cpu_case(layout, "bf16", "causal")
    got_init, fwd, _, (out, max_logit, stand_in), _ = run(te, case)
    fmt = case.layout_info.q_format
    same(got_init, init(qkv_format=fmt))
    same(fwd["forward"], {"qkv_format": fmt, "attn_mask_type": "causal"})
    assert fwd["fp8_recipe"] is None and max_logit is None and stand_in == {}
    assert out.shape == ((13, 2, 64) if fmt == "sbhd" else (2, 13, 64))


@pytest.mark.parametrize(
    "mask,te_mask",
    [
        ("no_mask", "padding"),
        ("causal", "padding_causal"),
        ("causal_bottom_right", "padding_causal_bottom_right"),
        ("padding", "padding"),
        ("padding_causal", "padding_causal"),
        ("padding_causal_bottom_right", "padding_causal_bottom_right"),
    ],
)
def test_thd_takes_the_padding_form_of_every_mask_type(te, mask, te_mask):
    case = cpu_case("thd_thd_thd", "bf16", mask, gqa=2)
    got_init, fwd, kw, (out, _, _), _ = run(te, case)
    same(got_init, init(qkv_format="thd", attn_mask_type=te_mask, num_gqa_groups=2))
    same(fwd["forward"], {
        "qkv_format": "thd", "attn_mask_type": te_mask, "cu_seqlens_q": kw["cu_seqlens_q"],
        "cu_seqlens_kv": kw["cu_seqlens_kv"], "max_seqlen_q": 13, "max_seqlen_kv": 13,
    })  # fmt: skip
    assert out.shape == (fwd["qkv"][0].shape[0], 64)  # [t, h * dv]


def test_padding_from_cu_seqlens_on_bshd(te):
    case = cpu_case("bshd_bs2hd", "fp32", "padding_causal")
    got_init, fwd, kw, _, _ = run(te, case)
    same(got_init, init(attn_mask_type="padding_causal"))
    same(fwd["forward"], {
        "qkv_format": "bshd", "attn_mask_type": "padding_causal",
        "cu_seqlens_q": kw["cu_seqlens_q"], "cu_seqlens_kv": kw["cu_seqlens_kv"],
    })  # fmt: skip


def test_padding_masks_pass_as_they_are_for_cross_attention(te):
    """attention_mask: True = masked out in TE and in the SPEC, so the very tensors go through."""
    case = cpu_case("sbhd_sbhd_sbhd", "bf16", "padding", cross=True, padding_from="mask")
    got_init, fwd, kw, _, _ = run(te, case)
    mq, mkv = kw["attention_mask"]
    assert mq.dtype == torch.bool and mq[:, 0, 0].any() and not mq[:, 0, 0].all()
    same(got_init, init(qkv_format="sbhd", attn_mask_type="padding", attention_type="cross"))
    same(fwd["forward"], {"qkv_format": "sbhd", "attn_mask_type": "padding",
                          "attention_mask": (mq, mkv)})  # fmt: skip


def test_arbitrary_mask_is_not_inverted(te):
    case = cpu_case("bshd_bshd_bshd", "fp32", "arbitrary")
    got_init, fwd, kw, _, _ = run(te, case)
    assert kw["attention_mask"][:, :, 1].all()  # the case's fully masked rows (True = masked)
    same(got_init, init(attn_mask_type="arbitrary"))
    same(fwd["forward"], {"qkv_format": "bshd", "attn_mask_type": "arbitrary",
                          "attention_mask": kw["attention_mask"]})  # fmt: skip


@pytest.mark.parametrize(
    "mask,window,te_window",
    [
        ("no_mask", (3, 2), (3, 2)),
        ("no_mask", (-1, -1), (-1, -1)),
        ("no_mask", (-1, 4), (26, 4)),  # one unbounded side: a bound wider than any row
        ("padding", (0, -1), (0, 26)),
        ("arbitrary", (-1, 0), (26, 0)),  # TE would read (-1, 0) as "no window" here
        ("causal", (5, 0), (5, 0)),
        ("padding_causal", (0, -1), (0, 0)),  # SPEC: causal types force wr = 0
        ("causal_bottom_right", (-1, 0), (-1, 0)),
    ],
)
def test_window_size(te, mask, window, te_window):
    case = cpu_case("bshd_bshd_bshd", "bf16", mask, window=window, padding_from="mask")
    got_init, fwd, _, _, _ = run(te, case)
    assert got_init["window_size"] == fwd["forward"]["window_size"] == te_window


def test_bottom_right_diagonal(te):
    case = cpu_case("sbhd_sbh2d", "bf16", "no_mask", window=(2, 2), bottom_right_diagonal=False)
    got_init, fwd, _, _, _ = run(te, case)
    same(got_init, init(qkv_format="sbhd", attn_mask_type="no_mask", window_size=(2, 2),
                        bottom_right_diagonal=False))  # fmt: skip
    same(fwd["forward"], {"qkv_format": "sbhd", "attn_mask_type": "no_mask",
                          "window_size": (2, 2), "bottom_right_diagonal": False})  # fmt: skip


@pytest.mark.parametrize(
    "bias_type,shape", [("pre_scale_bias", "111s"), ("post_scale_bias", "b1ss")]
)
def test_bias(te, bias_type, shape):
    case = cpu_case("bshd_bshd_bshd", "bf16", "no_mask", bias_type=bias_type, bias_shape=shape)
    got_init, fwd, kw, _, _ = run(te, case)
    same(got_init, init(attn_mask_type="no_mask"))
    same(fwd["forward"], {"qkv_format": "bshd", "attn_mask_type": "no_mask",
                          "core_attention_bias_type": bias_type,
                          "core_attention_bias": kw["core_attention_bias"]})  # fmt: skip


@pytest.mark.parametrize("slopes", [None, "h", "bh"])
def test_alibi(te, slopes):
    case = cpu_case("thd_t2hd", "bf16", "padding_causal", bias_type="alibi", alibi_slopes=slopes)
    _, fwd, kw, _, _ = run(te, case)
    expected = {
        "qkv_format": "thd", "attn_mask_type": "padding_causal",
        "core_attention_bias_type": "alibi",
        "cu_seqlens_q": kw["cu_seqlens_q"], "cu_seqlens_kv": kw["cu_seqlens_kv"],
        "max_seqlen_q": 13, "max_seqlen_kv": 13,
    }  # fmt: skip
    if slopes:
        expected["alibi_slopes"] = kw["alibi_slopes"]
        assert kw["alibi_slopes"].dtype == torch.float32
    same(fwd["forward"], expected)


def test_gqa_mqa_and_mla(te):
    mqa = cpu_case("bshd_bshd_bshd", "bf16", "causal", gqa=4)
    assert run(te, mqa)[0]["num_gqa_groups"] == 1
    mla = replace(cpu_case("sbhd_sbhd_sbhd", "bf16", "causal", gqa=2), dv=8)
    got_init, _, _, (out, _, _), _ = run(te, mla)
    same(got_init, init(qkv_format="sbhd", kv_channels=(16, 8), num_gqa_groups=2))
    assert out.shape == (13, 2, 4 * 8)


@pytest.mark.parametrize("via", ["arg", "param"])
def test_learnable_offset_is_loaded_into_te_parameter(te, via):
    """TE's forward has no softmax_offset: the module's Parameter gets the case's values and
    stands in for the leaf (its gradient is the case's dsoftmax_offset)."""
    case = cpu_case("sbh3d", "bf16", "no_mask", softmax_type="learnable", offset_via=via)
    got_init, fwd, kw, (_, _, stand_in), module = run(te, case)
    same(got_init, init(qkv_format="sbhd", attn_mask_type="no_mask", softmax_type="learnable"))
    same(fwd["forward"], {"qkv_format": "sbhd", "attn_mask_type": "no_mask"})
    assert stand_in["offset"] is module.softmax_offset
    assert torch.equal(module.softmax_offset.detach(), kw["softmax_offset"].detach())


def test_off_by_one_and_max_logit(te):
    case = cpu_case("bshd_bshd_bshd", "fp16", "causal", softmax_type="off-by-one",
                    return_max_logit=True)  # fmt: skip
    got_init, _, _, (out, max_logit, _), _ = run(te, case)
    same(got_init, init(softmax_type="off-by-one", return_max_logit=True))
    assert out.shape == (2, 13, 64) and max_logit.shape == (4,)


def test_dropout_goes_to_the_constructor(te):
    assert run(te, cpu_case("bshd_bshd_bshd", "fp32", "causal"), dropout=0.1)[0] == init(
        attention_dropout=0.1
    )


@pytest.mark.parametrize(
    "recipe,expected",
    [
        (te_fast.fp8.DelayedScaling(te_fast.fp8.Format.HYBRID, margin=1, amax_history_len=8,
                                    amax_compute_algo="most_recent"),
         ("DelayedScaling", dict(margin=1, fp8_format="HYBRID", amax_history_len=8,
                                 amax_compute_algo="most_recent", fp8_dpa=True))),
        (te_fast.fp8.CurrentScaling(te_fast.fp8.Format.E4M3),
         ("Float8CurrentScaling", dict(fp8_format="E4M3", fp8_dpa=True))),
    ],
)  # fmt: skip
@pytest.mark.parametrize("context", ["autocast", "fp8_autocast"])
def test_fp8_runs_under_te_autocast_with_the_recipe(te, monkeypatch, recipe, expected, context):
    if context == "fp8_autocast":  # TE before 2.12 has only fp8_autocast(fp8_recipe=...)
        monkeypatch.delattr(te, "autocast")
    case = cpu_case("bshd_bshd_bshd", "bf16", "causal")
    _, fwd, _, _, _ = run(te, case, fp8=True, fp8_meta={"recipe": recipe}, fp8_output=True)
    same(fwd["forward"], {"qkv_format": "bshd", "attn_mask_type": "causal", "fp8_output": True})
    got = fwd["fp8_recipe"]
    name, fields = expected
    assert type(got).__name__ == name
    assert {k: getattr(got, k) for k in fields} | {"fp8_format": got.fp8_format.name} == fields
    assert te.FP8["recipe"] is None  # the region was left


def test_fp8_combinations_te_cannot_run_are_clear_errors(te):
    case = cpu_case("bshd_bshd_bshd", "bf16", "causal")
    e5m2 = {"recipe": te_fast.fp8.DelayedScaling(te_fast.fp8.Format.E5M2)}
    with pytest.raises(NotImplementedError, match="Pure E5M2 training is not supported"):
        run(te, case, fp8=True, fp8_meta=e5m2)
    sink = replace(case, softmax_type="off-by-one")
    fp8 = {"recipe": te_fast.fp8.DelayedScaling()}
    with pytest.raises(NotImplementedError, match="neither sink softmax nor return_max_logit"):
        run(te, sink, fp8=True, fp8_meta=fp8)
    with pytest.raises(ValueError, match=r"fp8=True needs fp8_meta=\{'recipe': ...\}"):
        run(te, case, fp8=True)


def test_an_argument_without_a_te_mapping_is_an_error(te):
    with pytest.raises(TypeError, match=r"no TE mapping for \['fast_path'\]"):
        run(te, cpu_case("bshd_bshd_bshd", "bf16", "causal"), fast_path=True)


# ----------------------------------------------------------------------------- declared limits


def test_declared_capabilities(te):
    assert ADAPTER.lacks("dropout") is None and ADAPTER.lacks("sync_free") is None
    assert "assert statements" in ADAPTER.lacks("validates_arguments")
    assert "no_torch_dynamo" in ADAPTER.lacks("capturable")
    assert "get_rng_state_tracker" in ADAPTER.lacks("dropout_ctx")
    with pytest.raises(ValueError, match="unknown capability"):
        ADAPTER.lacks("dropuot")


@pytest.mark.parametrize(
    "case,reason",
    [
        (AttnCase("bshd_bshd_bshd", "fp32", "causal", device="cpu"),
         "does not support device 'cpu': DotProductAttention takes CUDA tensors only"),
        (AttnCase("thd_bshd_bshd", "bf16", "padding_causal_bottom_right", kv_cache_extra=9),
         "does not support layout 'thd_bshd_bshd': q and the kv cache in different formats"),
        (AttnCase("sbhd_bshd_bshd", "bf16", "causal"), "only inside its KV cache"),
        (AttnCase("thd_thd_thd", "bf16", "arbitrary"), "'thd' with padding mask types only"),
    ],
)  # fmt: skip
def test_inexpressible_cases_skip_with_reasons(te, case, reason):
    reasons = ADAPTER.not_supported_reasons(case)
    assert len(reasons) == 1 and reason in reasons[0], reasons


def test_plain_gpu_cases_are_supported(te):
    for case in (
        AttnCase("bshd_bshd_bshd", "bf16", "causal"),
        AttnCase("t3hd", "fp16", "no_mask", bias_type="alibi", softmax_type="learnable"),
        AttnCase("sbh3d", "bf16", "causal", window=(4, 0), bottom_right_diagonal=True,
                 return_max_logit=True),
    ):  # fmt: skip
        assert ADAPTER.not_supported_reasons(case) == [], case


def test_an_older_te_skips_what_it_cannot_take(te):
    """TE 2.7 and older: no bottom_right_diagonal, softmax_type, return_max_logit, fp8_output;
    the cases that need them skip naming the release that added them, the others run."""
    sys.modules["transformer_engine.pytorch.attention"].drop_arguments(
        "bottom_right_diagonal", "softmax_type", "return_max_logit", "fp8_output"
    )
    case = AttnCase("bshd_bshd_bshd", "bf16", "causal", bottom_right_diagonal=False,
                    softmax_type="learnable", return_max_logit=True)  # fmt: skip
    version = "transformer_engine 2.18.0+stand-in: DotProductAttention has no"
    assert ADAPTER.not_supported_reasons(case) == [
        f"{version} softmax_type argument (TE 2.8+)",
        f"{version} return_max_logit argument (TE 2.9+)",
        f"{version} bottom_right_diagonal argument (TE 2.12+)",
    ]
    got_init, _, _, _, _ = run(te, cpu_case("bshd_bshd_bshd", "bf16", "causal"))
    dropped = ("bottom_right_diagonal", "softmax_type", "return_max_logit")
    same(got_init, {k: v for k, v in init().items() if k not in dropped})


# ----------------------------------------------------------------------------- without TE


def test_without_te_every_case_skips_with_the_import_error(tmp_path):
    """The attention and compile suites under --impl transformer_engine with TE hidden: every
    case skips, and the reason is the import error (test_core's combinations that no layout can
    express skip before any adapter is asked, with that reason)."""
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    paths = [str(NO_TE), str(ROOT), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
        "--te-report", str(out), "--impl", "transformer_engine",
        "suites/test_attention.py", "suites/test_compile.py",
        "--deselect", "suites/test_compile.py::test_replays_leave_memory_flat",  # te_fast's own
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    cases = load_report(out)["cases"]
    reason = (
        "transformer_engine not installed: ImportError: "
        "transformer_engine hidden by tests/te_fixtures/no_te"
    )
    assert len(cases) > 500
    assert all("transformer_engine" in c["nodeid"] for c in cases)
    allowed = {reason, AttnCase("bs3hd", "bf16", "causal", hg=2).invalid_reason()}
    wrong = [(c["nodeid"], c["outcome"], c["skip_reason"]) for c in cases
             if c["outcome"] != "skipped" or c["skip_reason"] not in allowed]  # fmt: skip
    assert not wrong, wrong[:5]
    assert sum(c["skip_reason"] == reason for c in cases) > 500
