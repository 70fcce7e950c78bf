"""te_ref, the judge of every other suite, against what was typed by hand: the literal tables
themselves, the mask table and the literal values through te_ref in float64 and in the
same-precision composite (SPEC §6's two references), its default ALiBi slopes, and its FP8
scaling state over the three literal passes."""

from __future__ import annotations

import math

import pytest

import te_ref
import te_ref.fp8 as ref8
from te_conformance.reports import record
from te_conformance.suites import devices
from te_conformance.suites.adapters.base import FP8_ROLES as ROLES
from te_conformance.suites.adapters.te_ref import TeRef
from te_conformance.suites.checks.literal_values import (
    ALIBI_SHAPES,
    DISTANCES,
    EXAMPLE_BIAS,
    EXAMPLE_K,
    EXAMPLE_Q,
    EXAMPLE_QK,
    KEEP,
    MAX_LOGIT,
    SCORES,
    SINK_DENOMINATORS,
    SOFTMAX,
    R,
    slopes,
)
from te_conformance.suites.checks.mask_table import (
    ARBITRARY_GRIDS,
    CAUSAL_WINDOWS,
    GRIDS,
    NONCAUSAL_WINDOWS,
    SHAPES,
    VARIANTS,
    run_table,
)
from te_conformance.suites.fp8_cases import (
    THREE_PASS_KWARGS,
    THREE_PASS_RECIPES,
    THREE_PASS_VALUES,
    THREE_PASSES,
    three_pass_inputs,
)

DEVICES = devices.device_params()


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("recipe_name", list(THREE_PASSES))
def test_delayed_scaling_three_steps_te_ref(recipe_name, device_name):
    """te_ref's own scaling state over the three passes: the literal values of THREE_PASSES, and
    TE's history layout."""
    record.case(impl="te_ref.fp8", layout=f"fp8:delayed_{recipe_name}", device=device_name)
    device = devices.require(device_name, needs_te_fast=False)
    table = THREE_PASSES[recipe_name]
    state = ref8.FP8State(THREE_PASS_RECIPES[recipe_name], device)
    for step, (a, g) in enumerate(THREE_PASS_VALUES):
        q, k, v, grad_out = three_pass_inputs(a, g, device)
        steps = ref8.fp8_dot_product_attention(
            q, k, v, grad_out, softmax_scale=1.0, fp8_state=state, **THREE_PASS_KWARGS
        ).steps
        for role in ROLES:
            amaxes, used, after = table[role]
            r = steps[role]
            where = f"te_ref {role} pass {step + 1}"
            got = (r.amax.item(), r.scale_used.item(), r.scale.item())
            assert got == (amaxes[step], used[step], after[step]), where
            if state[role].delayed:  # TE's layout: slot 0 zeroed, this pass's amax at the end
                history = [0.0] + [amaxes[step]] * (len(r.amax_history) - 1)
                assert r.amax_history.tolist() == history, f"{where}: history {r.amax_history}"


# ----------------------------------------------------------------------------- the mask table


def test_table_is_well_formed():
    """Every grid has its shape's size and only '1'/'.' (or 'x'), and the table covers every
    (shape, extent, alignment, window): a typo fails here, not as a confusing mismatch."""
    applied = list(NONCAUSAL_WINDOWS.values()) + list(CAUSAL_WINDOWS.values())
    windows = {window for window, outcome in applied if outcome != "error"}
    for shape, (sq, skv) in SHAPES.items():
        for extent in ("full", "short", "left"):
            for alignment in ("TL", "BR"):
                for window in windows:
                    rows = GRIDS[(shape, extent, alignment, window)]
                    assert len(rows) == sq and all(len(r) == skv for r in rows), (shape, window)
                    assert set("".join(rows)) <= set("1."), (shape, extent, alignment, window)
        for column, rows in ARBITRARY_GRIDS[shape].items():
            assert len(rows) == sq and all(len(r) == skv for r in rows), (shape, column)
            assert set("".join(rows)) <= set("1.x"), (shape, column)
    assert len(GRIDS) == 3 * 3 * 2 * len(windows)


# te_ref's masks do not depend on the dtype: float64 (the golden answer) from fp32 inputs, and the
# same-precision composite (the SPEC §6 bound's other side) in bf16. Its FP8 emulation keeps a
# scaling state of its own (te_ref/fp8.py): one fresh per call, as a fresh module's.
TE_REF_ROWS = [
    pytest.param((name, mask, dtype, compute), id=f"{mask}-{name}-{dtype}-{compute}")
    for name, variant in VARIANTS.items()
    for mask in variant.mask_types
    for dtype, compute in (("fp32", "float64"), ("bf16", "same_precision"))
]


@pytest.mark.parametrize("row", TE_REF_ROWS)
def test_mask_table_te_ref(row):
    """te_ref itself (the judge of every other suite) against the literal table, in float64 (the
    golden answer) and in the input dtype (the same-precision composite of the SPEC §6 bound)."""
    variant_name, mask_type, dtype_name, compute = row
    run_table(TeRef(compute), variant_name, mask_type, dtype_name, "cpu")


# ----------------------------------------------------------------------------- the literal values


def test_tables_are_well_formed():
    """Each table has its shapes, and the worked values agree with the formulas they were
    worked from (a typo fails here, not as a confusing mismatch)."""
    for h in range(1, 17):
        assert len(slopes(h)) == h, h
    assert R == 2.0**-0.5
    for (shape, alignment), rows in DISTANCES.items():
        sq, skv = (int(n) for n in shape.split("x"))
        assert len(rows) == sq and all(len(r) == skv for r in rows), (shape, alignment)
    assert set(DISTANCES) == {(s, a) for s in ALIBI_SHAPES for a in ("TL", "BR")}
    qk = [[sum(a * b for a, b in zip(q, k)) for k in EXAMPLE_K] for q in EXAMPLE_Q]
    assert qk == EXAMPLE_QK
    for (bias_type, scale), rows in SCORES.items():
        for i in range(2):
            for j in range(3):
                b = EXAMPLE_BIAS[i][j]
                want = {
                    "no_bias": scale * qk[i][j], "pre_scale_bias": scale * (qk[i][j] + b),
                    "post_scale_bias": scale * qk[i][j] + b,
                }[bias_type]  # fmt: skip
                assert rows[i][j] == want, (bias_type, scale, i, j)
        for mask, keep in KEEP.items():
            kept = [rows[i][j] for i in range(2) for j in range(3) if keep[i][j] == "1"]
            assert MAX_LOGIT[(bias_type, scale)][mask] == max(kept), (bias_type, scale, mask)
    for key, probs in SOFTMAX.items():
        for s_row, p_row in zip(SCORES[key], probs):
            total = sum(math.exp(s) for s in s_row)
            for s, p in zip(s_row, p_row):
                assert abs(p - math.exp(s) / total) < 1e-15, key
    for (mask, offset), dens in SINK_DENOMINATORS.items():
        for i, d in enumerate(dens):
            row = SCORES[("post_scale_bias", 0.5)][i]
            kept = [s for s, k in zip(row, KEEP[mask][i]) if k == "1"]
            want = math.exp(offset) + sum(math.exp(s) for s in kept)
            assert abs(d - want) < 1e-14 * want, (mask, offset, i)


@pytest.mark.parametrize("h", range(1, 17), ids=lambda h: f"h{h}")
def test_default_alibi_slopes_te_ref(h):
    """te_ref's default slopes are the literal ones."""
    got = te_ref.default_alibi_slopes(h)
    want = slopes(h)
    assert len(got) == h
    assert all(abs(g - w) <= 1e-15 * w for g, w in zip(got, want)), (got, want)
