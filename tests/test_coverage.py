"""Coverage follows the adapter's support (suites/checks/coverage.py, docs/adapters.md "What
runs when an adapter lacks something"): a case that asks for max_logit runs on an adapter that
returns none, judging every other tensor; test_broad replaces what the adapter declines by the
nearest value it takes, under the same id; the skip reasons of window and max_logit come from
the support declaration's why; the mask table prints NaN and inf as such. CPU only, a few
seconds.

The adapters here are torch.sdpa (no max_logit, window, bias, sink, padding, thd), a variant of
it with a wrong output (a test that runs a case must also fail it), and a naive softmax whose
fully masked rows are NaN."""

from __future__ import annotations

import contextlib
import types
from dataclasses import replace

import pytest
import torch

from te_conformance.reports import record
from te_conformance.suites.adapters import ADAPTERS
from te_conformance.suites.adapters.base import Adapter, Support
from te_conformance.suites.adapters.torch_sdpa import TorchSdpa
from te_conformance.suites.cases import BROAD_COUNT, AttnCase, broad_matrix, sized
from te_conformance.suites.checks import coverage, mask_table
from te_conformance.suites.checks.attention import check_case
from te_conformance.suites.conformance import test_attention, test_semantics_values
from te_ref.layouts import LAYOUTS

SDPA = ADAPTERS["torch.sdpa"]


@contextlib.contextmanager
def recorded():
    """The case fields the code under test records (reports.record), merged as the report does."""
    item = types.SimpleNamespace(user_properties=[])
    saved = record._current_item
    record.set_current_item(item)
    fields: dict = {}
    try:
        yield fields
    finally:
        record.set_current_item(saved)
        for _, payload in item.user_properties:
            if payload.get("kind") == "case":
                fields.update({k: v for k, v in payload.items() if k != "kind"})


class OffSdpa(TorchSdpa):
    """torch.sdpa with the output off by 1 %: every run of a case must fail it."""

    name = "off_sdpa"

    def call(self, module, case, q, k, v, kwargs):
        out, max_logit, stand_in = super().call(module, case, q, k, v, kwargs)
        return out * 1.01, max_logit, stand_in


def runs(test, *args) -> None:
    """Run ``test``; a skip is a failure here (what these tests check is that the case runs)."""
    try:
        test(*args)
    except pytest.skip.Exception as e:
        pytest.fail(f"the case skipped whole: {e}")


def _broad(case_id: str) -> AttnCase:
    (case,) = [c for c in broad_matrix("cpu", BROAD_COUNT["cpu"]) if c.id == case_id]
    return case


# ----------------------------------------------------------------------------- reasons


def test_window_and_max_logit_reasons_come_from_the_declaration():
    class Plain(Adapter):
        name = "plain"
        support = Support(arguments=(), outputs=(),
                          why={"window_size": "no band here", "max_logit": "only the output"})

    case = AttnCase("bshd_bshd_bshd", "fp32", "causal", "cpu", window=(3, 0),
                    return_max_logit=True)  # fmt: skip
    declined = Plain().declines(case)
    assert [r.text for r in declined] == [
        "plain takes no window_size (a sliding window): no band here",
        "plain does not return max_logit: only the output",
    ]
    assert [r.feature for r in declined] == ["window", "max_logit"]


# ----------------------------------------------------------------------------- max_logit


MAX_LOGIT_CASE = sized(AttnCase("bshd_bshd_bshd", "fp32", "no_mask", device="cpu",
                                return_max_logit=True))  # fmt: skip


def test_a_max_logit_case_runs_without_it_and_judges_the_rest():
    """Once skipped whole on an adapter without max_logit: now out, dq, dk, dv are judged and
    the report learns that max_logit was not, and why."""
    with recorded() as fields:
        runs(check_case, SDPA, MAX_LOGIT_CASE)
    assert fields["not_judged"] == {"max_logit": "torch.sdpa does not return max_logit"}
    with pytest.raises(AssertionError, match="out"):
        check_case(OffSdpa(), MAX_LOGIT_CASE)


def test_te_fast_runs_every_case_as_asked():
    """te_fast takes every matrix case as asked: nothing is left out, substituted or recorded."""
    te_fast = ADAPTERS["te_fast"]
    for device, count in BROAD_COUNT.items():
        for case in broad_matrix(device, count):
            assert coverage.runnable(te_fast, case, substitute=True) == (case, {}), case.id


def test_bias_example_runs_without_max_logit():
    """test_semantics_values.test_bias_example asks for max_logit in each of its 108 cases: on
    an adapter without it the probabilities are still judged against the literals."""
    row = ("no_bias", 0.5, "no_mask")
    with recorded() as fields:
        runs(test_semantics_values.test_bias_example, SDPA, row, "fp32", "cpu")
    assert set(fields["not_judged"]) == {"max_logit"}
    with pytest.raises(AssertionError, match=r"out: max \|impl - ref64\|"):
        test_semantics_values.test_bias_example(OffSdpa(), row, "fp32", "cpu")


def test_mask_table_max_logit_variant_runs_without_it():
    with recorded() as fields:
        runs(mask_table.run_table, SDPA, "sbhd_max_logit", "arbitrary", "fp32", "cpu")
    assert set(fields["not_judged"]) == {"max_logit"}


# ----------------------------------------------------------------------------- test_broad

# a broad sample with a mixed layout, a padding mask type, ALiBi with user slopes, the learnable
# softmax and a window: torch.sdpa declines all five
BROAD_ID = "sbhd_bshd_bshd-bf16-padding_causal_bottom_right-alibi-slopes_bh-pad_mask_left-cpu"
BROAD_WITH_MAX_LOGIT = (
    "sbhd_bshd_bshd-fp32-causal-cross13x22-pre_scale_bias_b1ss-off-by-one-win5_0-diag_tl"
    "-max_logit-cpu"
)


def test_broad_substitutes_what_the_adapter_declines():
    """The nearest variant runs under the asked id, the substitution recorded with the
    adapter's reasons, and the fields the report reads are those of the case that ran."""
    case = _broad(BROAD_ID)
    with recorded() as fields:
        runs(test_attention.test_broad, SDPA, case)
    assert fields["substituted"] == {
        "layout": "sbhd_bshd_bshd -> sbhd_sbhd_sbhd: torch.sdpa does not support layout "
        "'sbhd_bshd_bshd'",
        "bias": "alibi_slopes_bh -> no_bias: torch.sdpa does not support bias type 'alibi'",
        "mask_type": "padding_causal_bottom_right -> causal: torch.sdpa does not support mask "
        "type 'padding_causal_bottom_right'",
    }
    assert (fields["layout"], fields["mask_type"], fields["bias_type"]) == (
        "sbhd_sbhd_sbhd", "causal", "no_bias",
    )  # fmt: skip
    with pytest.raises(AssertionError):
        test_attention.test_broad(OffSdpa(), case)


def test_broad_leaves_out_max_logit_and_substitutes_the_rest():
    case = _broad(BROAD_WITH_MAX_LOGIT)
    run, notes = coverage.runnable(SDPA, case, substitute=True)
    assert set(notes["not_judged"]) == {"max_logit"} and not run.return_max_logit
    # cross attention stays (the sample's shape); sdpa's top-left causal is square only
    assert set(notes["substituted"]) == {"layout", "bias", "softmax", "window",
                                         "bottom_right_diagonal", "mask_type"}  # fmt: skip
    assert (run.layout, run.mask_type, run.sq, run.skv) == ("sbhd_sbhd_sbhd", "no_mask", 13, 22)


def test_broad_substitutes_the_nearest_and_only_what_is_declined():
    class NoWindow(TorchSdpa):  # sdpa with every layout and mask type, no padding mask
        name = "no_window"
        support = replace(TorchSdpa.support, layouts=tuple(LAYOUTS), rules=(),
                          mask_types=("no_mask", "causal", "causal_bottom_right", "arbitrary"))

    # padding_from="mask" means nothing without a padding type: it stays as asked
    case = sized(AttnCase("bshd_bs2hd", "fp32", "causal_bottom_right", device="cpu",
                          window=(5, 0), bottom_right_diagonal=True, padding_from="mask"))
    run, notes = coverage.runnable(NoWindow(), case, substitute=True)
    assert run == replace(case, window=None, bottom_right_diagonal=None)
    assert set(notes["substituted"]) == {"window", "bottom_right_diagonal"}
    # a declined layout: the same packing first, else separate tensors before packed ones
    run, _ = coverage.runnable(SDPA, replace(case, window=None, bottom_right_diagonal=None,
                                             mask_type="no_mask"), substitute=True)  # fmt: skip
    assert run.layout == "bshd_bshd_bshd"


def test_broad_skips_only_where_no_variant_runs():
    """sdpa has no thd layout: a thd sample has no variant and skips with the asked case's
    reasons, as before."""
    case = next(c for c in broad_matrix("cpu", 60) if c.layout == "thd_thd_thd")
    assert coverage.runnable(SDPA, case, substitute=True) is None
    with pytest.raises(pytest.skip.Exception) as skipped:
        test_attention.test_broad(SDPA, case)
    assert str(skipped.value) == "; ".join(r.text for r in SDPA.declines(case))


# ----------------------------------------------------------------------------- the mask table


class NaiveAttention(Adapter):
    """softmax(masked_fill(Q K^T, mask, -inf)) V as written in many a model: a fully masked row
    comes out NaN (SPEC §2.4 wants 0). bshd, an arbitrary mask only."""

    name = "naive"
    support = Support(layouts=("bshd_bshd_bshd",), mask_types=("arbitrary",),
                      bias_types=("no_bias",), softmax_types=("vanilla",), arguments=(),
                      outputs=())  # fmt: skip

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        class Naive(torch.nn.Module):
            def forward(self, q, k, v, qkv_layout, attn_mask_type, attention_mask):
                q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, s, d)
                scores = (q @ k.transpose(-2, -1) * scale).masked_fill(attention_mask, -torch.inf)
                return (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)

        return Naive()


def test_render_shows_nan_and_inf():
    p = torch.tensor([[float("nan"), float("nan")], [0.0, 0.5], [float("inf"), -float("inf")]])
    assert mask_table._render(p) == "NN .1 II (N = NaN, I = inf or -inf)"
    assert mask_table._render(torch.tensor([[0.0, 0.25]])) == ".1"


def test_mask_table_failure_shows_nan_rows_as_nan():
    """The user's mask (head 0) masks row 1 fully: SPEC §2.4 wants 0 there, the naive softmax
    gives NaN; the message must say NaN, not draw the row as kept."""
    with pytest.raises(AssertionError) as failed:
        mask_table.run_table(NaiveAttention(), "bshd", "arbitrary", "fp32", "cpu")
    message = str(failed.value)
    assert "expected .1111 ..... 1111., got .1111 NNNNN 1111. (N = NaN)" in message, message
