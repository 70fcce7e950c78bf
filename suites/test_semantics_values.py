"""The semantics table's values: ALiBi slopes and bias matrices, pre- and post-scale bias,
max_logit under masks, the sink softmax's denominators and the softmax scale at 0 and below,
as literals typed by hand from Transformer Engine 2.20.2's formulas.

Why: te_ref and te_fast each code the slope series, the bias formulas, max_logit and the sink,
and the attention suites compare the two with each other; a misreading both share passes
there (the second slope series changed from 2^(-4k/n) to 2^(-8k/n) in both passed every ALiBi
case). suites/test_semantics.py pins the masks; this file pins the values. No expected value
comes from te_ref or te_fast: each is a literal below, or torch.softmax / amax / a product of
literals (the definition, one line, in float64). TE's lines (paths relative to
transformer_engine/pytorch/attention/dot_product_attention/ of the 2.20.2 wheel):

- default ALiBi slopes, utils.py:2178-2186 (get_alibi): n = 2**floor(log2 h), slopes
  (2**(-8/n))**k for k = 1..n, then (2**(-4/n))**k for k = 1, 3, 5, ... (h - n of them);
- the ALiBi bias, utils.py:2198-2219: -slope * |i - j + off|, off = skv - sq bottom-right
  (the alignment argument, backends.py:678-682), 0 top-left; added after the scale
  (backends.py:665-699, as post_scale_bias);
- pre_scale_bias S = scale * (Q K^T + B), backends.py:656-663; post_scale_bias
  S = scale * Q K^T + B, backends.py:665-699;
- max_logit = amax over batch, rows and columns of those scores with the mask applied,
  backends.py:710-717 (SPEC §1: of the unmasked positions);
- the sink: one column of softmax_offset[h] (0 for off-by-one, dot_product_attention.py:
  960-971) appended to the scores before the softmax and dropped after, backends.py:719-746,
  so every row's denominator gains exp(offset) (SPEC §2.4).

How the values are observed: v = identity (dv = skv), so each output row is the probability
row itself (as in test_semantics.py); max_logit as the module returns it. Each pin runs through
every selected adapter (SPEC §6's rule, with the literal as the float64 answer and te_ref's
same-precision composite for the bound) and through te_ref (float64 to 1e-12 of the literal;
the same-precision composite within the semantics table's tolerances).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import te_ref
from reports import record
from suites import devices
from suites.cases import DTYPES, AttnCase
from suites.checks import coverage
from suites.checks.attention import xfail_deviations
from suites.checks.numerics import K_BACKWARD, K_FORWARD, check_ratio

pytestmark = pytest.mark.usefixtures("one_thread")  # suites/plugin.py: tiny tensors, one thread

# ----------------------------------------------------------------------------- the literals

# The default ALiBi slopes: slope = 2**-e for each exponent e, head by head. Typed from TE's two
# series: before '|' the n = 2**floor(log2 h) terms (2**(-8/n))**k, k = 1..n; after it the
# h - n terms (2**(-4/n))**k, k = 1, 3, 5, ...
SLOPE_EXPONENTS = {
    1: "8",
    2: "4 8",
    3: "4 8 | 2",
    4: "2 4 6 8",
    5: "2 4 6 8 | 1",
    6: "2 4 6 8 | 1 3",
    7: "2 4 6 8 | 1 3 5",
    8: "1 2 3 4 5 6 7 8",
    9: "1 2 3 4 5 6 7 8 | 0.5",
    10: "1 2 3 4 5 6 7 8 | 0.5 1.5",
    11: "1 2 3 4 5 6 7 8 | 0.5 1.5 2.5",
    12: "1 2 3 4 5 6 7 8 | 0.5 1.5 2.5 3.5",
    13: "1 2 3 4 5 6 7 8 | 0.5 1.5 2.5 3.5 4.5",
    14: "1 2 3 4 5 6 7 8 | 0.5 1.5 2.5 3.5 4.5 5.5",
    15: "1 2 3 4 5 6 7 8 | 0.5 1.5 2.5 3.5 4.5 5.5 6.5",
    16: "0.5 1 1.5 2 2.5 3 3.5 4 4.5 5 5.5 6 6.5 7 7.5 8",
}
R = 0.70710678118654757  # 2**-0.5: every half-integer exponent's slope is R * 2**-floor(e)


def slopes(h: int) -> list[float]:
    """The literal slopes of h heads: 2**-e exactly for integer e, R * 2**-floor(e) else."""
    out = []
    for word in SLOPE_EXPONENTS[h].replace("|", " ").split():
        e = float(word)
        out.append(2.0**-e if e.is_integer() else R * 2.0 ** -math.floor(e))
    return out


# ALiBi distances |i - j + off|, one digit a key, one row a query: "<sq>x<skv> <TL|BR>" then the
# rows. TL: off = 0; BR: off = skv - sq.
ALIBI_DISTANCES = """
2x3 TL
012
101

2x3 BR
101
210

2x4 TL
0123
1012

2x4 BR
2101
3210

3x3 TL
012
101
210

3x3 BR
012
101
210

3x4 TL
0123
1012
2101

3x4 BR
1012
2101
3210

3x2 TL
01
10
21

3x2 BR
12
01
10
"""


def _parse_distances(text: str) -> dict:
    grids = {}
    for block in text.strip().split("\n\n"):
        header, *rows = block.splitlines()
        shape, alignment = header.split()
        grids[(shape, alignment)] = [[float(c) for c in row] for row in rows]
    return grids


DISTANCES = _parse_distances(ALIBI_DISTANCES)
ALIBI_SHAPES = ("2x3", "2x4", "3x3", "3x4", "3x2")  # (sq < skv, sq = skv, sq > skv)
USER_SLOPES = (1.0, 0.5, 0.25)  # alibi_slopes [h]: the matrix itself, -distance, in head 0

# The 2x3 example (b = 1, h = 1, sq = 2, skv = 3, d = 2): small integers, so that every score is
# exact in every dtype. Q K^T = [[0, 2, 2], [2, 0, 2]].
EXAMPLE_Q = [[1.0, 0.0], [0.0, 1.0]]
EXAMPLE_K = [[0.0, 2.0], [2.0, 0.0], [2.0, 2.0]]
EXAMPLE_QK = [[0.0, 2.0, 2.0], [2.0, 0.0, 2.0]]
EXAMPLE_BIAS = [[0.0, 0.0, 2.0], [-2.0, 0.5, 1.0]]
SCALES = (0.5, -0.5, 0.0)

# The scores S by (bias type, softmax scale): pre_scale_bias scale * (QK + B), post_scale_bias
# scale * QK + B, no_bias scale * QK, worked by hand.
SCORES = {
    ("no_bias", 0.5): [[0, 1, 1], [1, 0, 1]],
    ("no_bias", -0.5): [[0, -1, -1], [-1, 0, -1]],
    ("no_bias", 0.0): [[0, 0, 0], [0, 0, 0]],
    ("pre_scale_bias", 0.5): [[0, 1, 2], [0, 0.25, 1.5]],
    ("pre_scale_bias", -0.5): [[0, -1, -2], [0, -0.25, -1.5]],
    ("pre_scale_bias", 0.0): [[0, 0, 0], [0, 0, 0]],
    ("post_scale_bias", 0.5): [[0, 1, 3], [-1, 0.5, 2]],
    ("post_scale_bias", -0.5): [[0, -1, 1], [-3, 0.5, 0]],
    ("post_scale_bias", 0.0): [[0, 0, 2], [-2, 0.5, 1]],
}  # fmt: skip

# softmax(S) of the two biased examples at scale 0.5, exp(s_j) / sum_k exp(s_k) to 17 digits.
SOFTMAX = {
    ("pre_scale_bias", 0.5): [
        [0.090030573170380462, 0.24472847105479764, 0.6652409557748219],
        [0.14780404965619498, 0.1897841564479314, 0.66241179389587368],
    ],
    ("post_scale_bias", 0.5): [
        [0.042010066134066049, 0.11419519938459448, 0.84379473448133946],
        [0.039112573270687449, 0.17529039214003669, 0.78559703458927588],
    ],
}

# The masks of the example ('1' kept, '.' masked out): causal keeps j <= i (top-left),
# causal_bottom_right j <= i + 1 (skv - sq = 1), arbitrary the user's mask of column 2.
KEEP = {
    "no_mask": ("111", "111"),
    "causal": ("1..", "11."),
    "causal_bottom_right": ("11.", "111"),
    "arbitrary": ("11.", "11."),
}

# max_logit (h = 1) by (bias type, scale) and mask: the max of S over the kept positions.
MAX_LOGIT = {
    ("no_bias", 0.5): {"no_mask": 1, "causal": 1, "causal_bottom_right": 1, "arbitrary": 1},
    ("no_bias", -0.5): {"no_mask": 0, "causal": 0, "causal_bottom_right": 0, "arbitrary": 0},
    ("no_bias", 0.0): {"no_mask": 0, "causal": 0, "causal_bottom_right": 0, "arbitrary": 0},
    ("pre_scale_bias", 0.5): {"no_mask": 2, "causal": 0.25, "causal_bottom_right": 1.5,
                              "arbitrary": 1},
    ("pre_scale_bias", -0.5): {"no_mask": 0, "causal": 0, "causal_bottom_right": 0,
                               "arbitrary": 0},
    ("pre_scale_bias", 0.0): {"no_mask": 0, "causal": 0, "causal_bottom_right": 0,
                              "arbitrary": 0},
    ("post_scale_bias", 0.5): {"no_mask": 3, "causal": 0.5, "causal_bottom_right": 2,
                               "arbitrary": 1},
    ("post_scale_bias", -0.5): {"no_mask": 1, "causal": 0.5, "causal_bottom_right": 0.5,
                                "arbitrary": 0.5},
    ("post_scale_bias", 0.0): {"no_mask": 2, "causal": 0.5, "causal_bottom_right": 1,
                               "arbitrary": 0.5},
}  # fmt: skip

# max_logit over the batch with padding (q = 0, post_scale_bias: S = B). b = 2, h = 2, sq = 2,
# skv = 3; batch element 1 has lengths (1, 2): its row 1 and column 2 are padding, and hold
# the largest scores. Expected [h]: head 0 max(2, 1), head 1 max(1, 3).
PAD_BIAS = [
    [[[0, 1, -1], [2, 0, 0]], [[0, 0, 0], [0, -1, 1]]],
    [[[1, 0, 9], [9, 9, 9]], [[3, 0, 9], [9, 9, 9]]],
]
PAD_LENGTHS = ([2, 1], [3, 2])
PAD_MAX_LOGIT = [2.0, 3.0]

# The sink softmax's denominators D = exp(offset) + sum over kept j of exp(s_j), for the
# post_scale_bias example at scale 0.5 (S = [[0, 1, 3], [-1, 0.5, 2]]), by mask and offset
# (off-by-one: 0), one per row. P_j = exp(s_j) / D on kept positions.
SINK_DENOMINATORS = {
    ("no_mask", 0.0): (24.803818751646713, 10.40565681080222),
    ("no_mask", -1.0): (24.171698192818155, 9.7735362519736633),
    ("no_mask", 2.0): (31.192874850577365, 16.794712909732873),
    ("causal", 0.0): (2.0, 3.0166007118715705),
    ("causal", -1.0): (1.3678794411714423, 2.3844801530430129),
    ("causal", 2.0): (8.3890560989306504, 9.4056568108022205),
}
LEARNABLE_OFFSETS = (-1.0, 2.0)  # softmax_offset [h] of the learnable rows (h = 2)

# The same-precision composite's own tolerance against a literal, relative (test_semantics.py's
# TOLERANCE: the table's observations are the same kind of probability rows).
LP_TOLERANCE = {"fp32": 1e-6, "fp16": 2e-3, "bf16": 1e-2}
REF64_TOLERANCE = 1e-12  # te_ref in float64 against a float64 literal (values of order 1)


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


# ----------------------------------------------------------------------------- running a call




class TeRefCall:
    """te_ref.dot_product_attention, in float64 ("float64") or in the input dtype."""

    def __init__(self, compute: str):
        self.compute = compute
        self.name = f"te_ref_{compute}"

    def run(self, case: AttnCase, q, k, v, kwargs, scale):
        compute = torch.float64 if self.compute == "float64" else DTYPES[case.dtype]
        out, max_logit = te_ref.dot_product_attention(
            q, k, v, softmax_scale=scale, softmax_type=case.softmax_type,
            attention_type=case.attention_type, return_max_logit=True, compute_dtype=compute,
            **kwargs,
        )  # fmt: skip
        return out, max_logit


def _as_run(adapter, case: AttnCase) -> tuple[AttnCase, dict]:
    """(the case as the adapter runs it, what the report records): max_logit left out where the
    adapter returns none (suites/checks/coverage.py); the case itself where it cannot run."""
    return coverage.runnable(adapter, case) or (case, {})


def _adapter_run(adapter, case: AttnCase, q, k, v, kwargs, scale):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, max_logit, _ = adapter.call(adapter.build(case, scale), case, q, k, v, dict(kwargs))
    return out, max_logit


def _probabilities(out: torch.Tensor, case: AttnCase) -> torch.Tensor:
    """bshd output (b, sq, h * skv) with v = identity -> probabilities (b, h, sq, skv)."""
    return out.detach().view(case.b, case.sq, case.h, case.skv).permute(0, 2, 1, 3)


def _inputs(case: AttnCase, q_rows, k_rows, device):
    """bshd q, k (the same rows in every batch element and head) and v = identity."""
    dtype = DTYPES[case.dtype]

    def layer(rows, s):
        t = torch.tensor(rows, dtype=torch.float64).view(1, s, 1, -1)
        return t.expand(case.b, s, case.h, t.shape[-1]).to(device=device, dtype=dtype)

    q = (
        layer(q_rows, case.sq)
        if q_rows is not None
        else torch.zeros(case.b, case.sq, case.h, case.d, dtype=dtype, device=device)
    )
    k = (
        layer(k_rows, case.skv)
        if k_rows is not None
        else torch.ones(case.b, case.skv, case.h, case.d, dtype=dtype, device=device)
    )
    eye = torch.eye(case.skv, dtype=dtype, device=device).view(1, case.skv, 1, case.skv)
    return q.contiguous(), k.contiguous(), eye.expand(case.b, -1, case.h, -1).contiguous()


def judge_pin(adapter, case: AttnCase, q, k, v, kwargs, scale, probs64, max_logit64=None):
    """The adapter's probabilities (and max_logit) against the literal under SPEC §6, the bound
    from te_ref's same-precision composite; te_ref itself against the literal, float64 to
    REF64_TOLERANCE and the same-precision composite to LP_TOLERANCE; the adapter's max_logit
    only where it returns one (te_ref's always). Returns the failures."""
    failures = []
    run, notes = _as_run(adapter, case)
    ref64 = TeRefCall("float64").run(case, q, k, v, kwargs, scale)
    ref_lp = TeRefCall("same_precision").run(case, q, k, v, kwargs, scale)
    for name, (out, ml) in (("te_ref float64", ref64), ("te_ref same precision", ref_lp)):
        p = _probabilities(out, case).double()
        tol = REF64_TOLERANCE if out.dtype == torch.float64 else LP_TOLERANCE[case.dtype]
        err = ((p - probs64).abs() / probs64.abs().clamp_min(1e-300)).max().item()
        if err > tol:
            failures.append(f"{name}: probabilities off the literal by {err:.3g} (relative)")
        if max_logit64 is not None and (ml.double() - max_logit64).abs().max().item() > tol:
            failures.append(f"{name}: max_logit {ml.tolist()}, literal {max_logit64.tolist()}")
    out, max_logit = _adapter_run(adapter, run, q, k, v, kwargs, scale)
    dtype = DTYPES[case.dtype]
    checks = [("out", _probabilities(out, case), probs64, _probabilities(ref_lp[0], case))]
    if max_logit64 is not None and "max_logit" not in notes.get("not_judged", {}):
        if max_logit is None or max_logit.shape != (case.h,) or max_logit.dtype != torch.float32:
            got = None if max_logit is None else (tuple(max_logit.shape), max_logit.dtype)
            failures.append(f"max_logit must be fp32 [h] (SPEC §1), got {got}")
        else:
            checks.append(("max_logit", max_logit, max_logit64, ref_lp[1]))
    for name, impl, lit, lp in checks:
        try:
            check_ratio(name, impl, lit, lp, K_FORWARD, dtype)
        except AssertionError as e:
            failures.append(str(e))
    return failures


def settle(adapter, case: AttnCase, failures: list[str], kwargs=None) -> None:
    """Fail listing the differences from the literals; where the adapter's recorded deviations
    (SPEC §7) explain the case as it ran, a strict expected failure: it must differ."""
    deviations = adapter.known_deviations(_as_run(adapter, case)[0], call_kwargs=kwargs)
    if deviations and failures:
        xfail_deviations(
            adapter, deviations,
            " | ".join(sorted(getattr(d, "reason", str(d)) for d in deviations)),
        )  # fmt: skip
    assert not deviations, f"recorded deviations {deviations} predicted, but the values match"
    assert not failures, f"{len(failures)} differences from the literals:\n" + "\n".join(
        failures[:24]
    )


def _start(adapter, case: AttnCase, table: str) -> torch.device:
    record.case(impl=adapter.name, **case.fields(), table=table)
    device = devices.require(case.device, needs_te_fast=False)
    found = coverage.runnable(adapter, case)  # None: nothing of the case runs on the adapter
    reason = adapter.unavailable_reason(case.device) or (
        "; ".join(adapter.not_supported_reasons(case)) if found is None else None
    )
    if reason:
        pytest.skip(reason)
    if found[1]:
        record.case(**found[1])  # not_judged: max_logit, where the adapter returns none
    return device


DTYPE_NAMES = ("fp32", "bf16", "fp16")


# ----------------------------------------------------------------------------- ALiBi


@pytest.mark.parametrize("h", range(1, 17), ids=lambda h: f"h{h}")
def test_default_alibi_slopes_te_ref(h):
    """te_ref's default slopes are the literal ones."""
    got = te_ref.default_alibi_slopes(h)
    want = slopes(h)
    assert len(got) == h
    assert all(abs(g - w) <= 1e-15 * w for g, w in zip(got, want)), (got, want)


def _softmax64(scores, keep=None):
    """softmax over the last dim of float64 scores; keep (bool) marks the kept positions."""
    s = torch.as_tensor(scores, dtype=torch.float64)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1)


@pytest.mark.per_adapter(dtype_name=DTYPE_NAMES, device_name=devices.device_params())
def test_alibi_default_slopes(adapter, dtype_name, device_name):
    """The default slopes of h = 1..16 heads, as the probabilities of q = 0 under ALiBi on the
    3x4 bottom-right distances (no_mask, alignment by default bottom-right): softmax of
    -slope_h * |i - j + 1| per head, through the adapter and te_ref."""
    failures = []
    for h in range(1, 17):
        case = AttnCase("bshd_bshd_bshd", dtype_name, "no_mask", device=device_name, b=1,
                        sq=3, skv=4, h=h, hg=h, d=2, dv=4, bias_type="alibi")  # fmt: skip
        device = _start(adapter, case, "alibi_default_slopes")
        q, k, v = _inputs(case, None, None, device)
        dist = torch.tensor(DISTANCES[("3x4", "BR")], dtype=torch.float64)
        bias = -torch.tensor(slopes(h), dtype=torch.float64).view(1, h, 1, 1) * dist
        kwargs = dict(qkv_layout=case.layout, attn_mask_type="no_mask",
                      core_attention_bias_type="alibi")  # fmt: skip
        found = judge_pin(adapter, case, q, k, v, kwargs, 0.5, _softmax64(bias).to(device))
        failures += [f"h={h}: {f}" for f in found]
    settle(adapter, case, failures)


@pytest.mark.per_adapter(
    slopes_from=("default", "user"), dtype_name=DTYPE_NAMES, device_name=devices.device_params()
)
def test_alibi_bias_matrix(adapter, slopes_from, dtype_name, device_name):
    """The ALiBi bias matrix of every shape in ALIBI_DISTANCES at both alignments
    (bottom_right_diagonal None and True: bottom-right; False: top-left), three heads, with
    the default slopes (2**-4, 2**-8, 2**-2) or user slopes [h] (1, 0.5, 0.25): the
    probabilities of q = 0 are softmax(-slope_h * distance)."""
    failures = []
    h = 3
    head_slopes = slopes(h) if slopes_from == "default" else list(USER_SLOPES)
    for shape in ALIBI_SHAPES:
        sq, skv = (int(n) for n in shape.split("x"))
        for diag in (None, True, False):
            alignment = "TL" if diag is False else "BR"
            case = AttnCase(
                "bshd_bshd_bshd", dtype_name, "no_mask", device=device_name, b=1, sq=sq,
                skv=skv, h=h, hg=h, d=2, dv=skv, bias_type="alibi",
                alibi_slopes="h" if slopes_from == "user" else None, bottom_right_diagonal=diag,
            )  # fmt: skip
            device = _start(adapter, case, "alibi_bias_matrix")
            q, k, v = _inputs(case, None, None, device)
            kwargs = dict(qkv_layout=case.layout, attn_mask_type="no_mask",
                          core_attention_bias_type="alibi")  # fmt: skip
            if diag is not None:
                kwargs["bottom_right_diagonal"] = diag
            if slopes_from == "user":
                kwargs["alibi_slopes"] = torch.tensor(USER_SLOPES, device=device)
            dist = torch.tensor(DISTANCES[(shape, alignment)], dtype=torch.float64)
            bias = -torch.tensor(head_slopes, dtype=torch.float64).view(1, h, 1, 1) * dist
            found = judge_pin(adapter, case, q, k, v, kwargs, 0.5, _softmax64(bias).to(device))
            failures += [f"{shape} bottom_right_diagonal={diag}: {f}" for f in found]
    settle(adapter, case, failures)


# ----------------------------------------------------------------------------- bias, max_logit


def _keep(mask: str, device) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in KEEP[mask]], device=device)


EXAMPLE_ROWS = [
    pytest.param((bias_type, scale, mask), id=f"{bias_type}-scale{scale:g}-{mask}")
    for bias_type in ("no_bias", "pre_scale_bias", "post_scale_bias")
    for scale in SCALES
    for mask in KEEP
]


@pytest.mark.per_adapter(
    row=EXAMPLE_ROWS, dtype_name=DTYPE_NAMES, device_name=devices.device_params()
)
def test_bias_example(adapter, row, dtype_name, device_name):
    """The 2x3 example under each bias type, softmax scale (0.5, -0.5 and exactly 0: TE takes
    any float, it checks none) and mask: the probabilities are the literal scores' softmax over
    the kept positions (the literal SOFTMAX rows where typed), max_logit the literal MAX_LOGIT.
    A negative scale reverses the scores' order; at scale 0 pre_scale_bias leaves uniform rows
    and post_scale_bias the bias alone."""
    bias_type, scale, mask = row
    case = AttnCase("bshd_bshd_bshd", dtype_name, mask, device=device_name, b=1, sq=2, skv=3,
                    h=1, hg=1, d=2, dv=3, bias_type=bias_type, bias_shape="11ss",
                    return_max_logit=True)  # fmt: skip
    device = _start(adapter, case, "bias_example")
    q, k, v = _inputs(case, EXAMPLE_Q, EXAMPLE_K, device)
    kwargs = dict(qkv_layout=case.layout, attn_mask_type=mask)
    if bias_type != "no_bias":
        kwargs["core_attention_bias_type"] = bias_type
        kwargs["core_attention_bias"] = torch.tensor(
            EXAMPLE_BIAS, dtype=DTYPES[dtype_name], device=device
        ).view(1, 1, 2, 3)
    if mask == "arbitrary":
        kwargs["attention_mask"] = ~_keep(mask, device).view(1, 1, 2, 3)
    keep = _keep(mask, device)
    probs = _softmax64(SCORES[(bias_type, scale)], keep.cpu()).view(1, 1, 2, 3).to(device)
    if (bias_type, scale) in SOFTMAX and mask == "no_mask":
        typed = torch.tensor(SOFTMAX[(bias_type, scale)], dtype=torch.float64, device=device)
        assert torch.allclose(probs[0, 0], typed, rtol=1e-15, atol=0)
        probs = typed.view(1, 1, 2, 3)
    max_logit = torch.tensor([MAX_LOGIT[(bias_type, scale)][mask]], dtype=torch.float64,
                             device=device)  # fmt: skip
    failures = judge_pin(adapter, case, q, k, v, kwargs, scale, probs, max_logit)
    settle(adapter, case, failures, kwargs)


@pytest.mark.per_adapter(dtype_name=DTYPE_NAMES, device_name=devices.device_params())
def test_max_logit_over_batch_with_padding(adapter, dtype_name, device_name):
    """max_logit is the max over the batch of the unmasked scores: padding rows and columns
    holding the largest scores (9) do not count, and each head's max comes from a different
    batch element (q = 0, post_scale_bias: S = PAD_BIAS)."""
    case = AttnCase("bshd_bshd_bshd", dtype_name, "padding", device=device_name, b=2, sq=2,
                    skv=3, h=2, hg=2, d=2, dv=3, bias_type="post_scale_bias",
                    bias_shape="bhss", return_max_logit=True)  # fmt: skip
    device = _start(adapter, case, "max_logit_padding")
    q, k, v = _inputs(case, None, None, device)
    cu_q, cu_kv = ([0, *[sum(n[: i + 1]) for i in range(2)]] for n in PAD_LENGTHS)
    bias = torch.tensor(PAD_BIAS, dtype=torch.float64)
    kwargs = dict(
        qkv_layout=case.layout, attn_mask_type="padding",
        core_attention_bias_type="post_scale_bias",
        core_attention_bias=bias.to(device=device, dtype=DTYPES[dtype_name]),
        cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
        cu_seqlens_kv=torch.tensor(cu_kv, dtype=torch.int32, device=device),
    )  # fmt: skip
    keep = torch.ones(2, 1, 2, 3, dtype=torch.bool)
    keep[1, :, 1, :] = False  # batch element 1: query 1 and key 2 are padding
    keep[1, :, :, 2] = False
    probs = _softmax64(bias, keep).masked_fill(~keep.any(-1, keepdim=True), 0.0)
    max_logit = torch.tensor(PAD_MAX_LOGIT, dtype=torch.float64, device=device)
    failures = judge_pin(adapter, case, q, k, v, kwargs, 0.5, probs.to(device), max_logit)
    settle(adapter, case, failures, kwargs)


# ----------------------------------------------------------------------------- the sink


SINK_ROWS = [
    pytest.param((softmax_type, mask), id=f"{softmax_type}-{mask}")
    for softmax_type in ("off-by-one", "learnable")
    for mask in ("no_mask", "causal")
]


@pytest.mark.per_adapter(row=SINK_ROWS, dtype_name=DTYPE_NAMES,
                         device_name=devices.device_params())  # fmt: skip
def test_sink_denominators(adapter, row, dtype_name, device_name):
    """The sink softmax on the post_scale_bias example at scale 0.5, two heads: each kept
    probability is exp(s_j) / D with D the literal SINK_DENOMINATORS (offset 0 for off-by-one;
    softmax_offset (-1, 2) for learnable), masked positions 0."""
    softmax_type, mask = row
    case = AttnCase("bshd_bshd_bshd", dtype_name, mask, device=device_name, b=1, sq=2, skv=3,
                    h=2, hg=2, d=2, dv=3, bias_type="post_scale_bias", bias_shape="11ss",
                    softmax_type=softmax_type)  # fmt: skip
    device = _start(adapter, case, "sink_denominators")
    q, k, v = _inputs(case, EXAMPLE_Q, EXAMPLE_K, device)
    kwargs = dict(
        qkv_layout=case.layout, attn_mask_type=mask, core_attention_bias_type="post_scale_bias",
        core_attention_bias=torch.tensor(EXAMPLE_BIAS, dtype=DTYPES[dtype_name],
                                         device=device).view(1, 1, 2, 3),
    )  # fmt: skip
    offsets = (0.0, 0.0) if softmax_type == "off-by-one" else LEARNABLE_OFFSETS
    if softmax_type == "learnable":
        kwargs["softmax_offset"] = torch.tensor(offsets, dtype=torch.float32, device=device)
    scores = torch.tensor(SCORES[("post_scale_bias", 0.5)], dtype=torch.float64)
    keep = _keep(mask, "cpu")
    probs = torch.zeros(1, 2, 2, 3, dtype=torch.float64)
    for head, offset in enumerate(offsets):
        den = torch.tensor(SINK_DENOMINATORS[(mask, offset)], dtype=torch.float64).view(2, 1)
        probs[0, head] = torch.where(keep, scores.exp() / den, 0.0)
    failures = judge_pin(adapter, case, q, k, v, kwargs, 0.5, probs.to(device))
    settle(adapter, case, failures, kwargs)


# ----------------------------------------------------------------------------- scale 0


@pytest.mark.per_adapter(
    mask=("no_mask", "causal", "causal_bottom_right"), dtype_name=DTYPE_NAMES,
    device_name=devices.device_params(),
)  # fmt: skip
def test_scale_zero_gradients(adapter, mask, dtype_name, device_name):
    """softmax_scale exactly 0 with random q, k, v and dO (the 2x3 masks of KEEP, two batch
    elements, two heads): the attention is uniform over the kept keys (P = 1/n there, the
    literal), so out = P V, dv = P^T dO, and no gradient reaches q or k (dq = dk = 0: the scores
    do not depend on them). SPEC §6 against those float64 products of the literal P, the bound
    from te_ref's same-precision composite; te_ref float64 to REF64_TOLERANCE."""
    case = AttnCase("bshd_bshd_bshd", dtype_name, mask, device=device_name, b=2, sq=2, skv=3,
                    h=2, hg=2, d=4, dv=5)  # fmt: skip
    device = _start(adapter, case, "scale_zero")
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(7)

    def randn(*shape, magnitude=1.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * magnitude).to(dtype)

    leaves = {"q": randn(2, 2, 2, 4, magnitude=8.0), "k": randn(2, 3, 2, 4, magnitude=8.0),
              "v": randn(2, 3, 2, 5)}  # fmt: skip
    d_out = randn(2, 2, 10).to(device)
    kwargs = dict(qkv_layout=case.layout, attn_mask_type=mask)

    def grads(run, compute_dtype=None):
        ts = {n: t.to(device=device, dtype=compute_dtype or dtype).requires_grad_()
              for n, t in leaves.items()}  # fmt: skip
        out = run(ts["q"], ts["k"], ts["v"])
        got = torch.autograd.grad(out, list(ts.values()), d_out.to(out.dtype))
        return {"out": out.detach(), **{f"d{n}": g for n, g in zip(ts, got)}}

    keep = _keep(mask, "cpu").double()
    probs = (keep / keep.sum(-1, keepdim=True)).view(1, 1, 2, 3)  # the literal: 1/n where kept
    v64 = leaves["v"].double().permute(0, 2, 1, 3)  # (b, h, skv, dv)
    do64 = d_out.cpu().double().view(2, 2, 2, 5).permute(0, 2, 1, 3)  # (b, h, sq, dv)
    want = {
        "out": (probs @ v64).permute(0, 2, 1, 3).reshape(2, 2, 10),
        "dq": torch.zeros(2, 2, 2, 4, dtype=torch.float64),
        "dk": torch.zeros(2, 3, 2, 4, dtype=torch.float64),
        "dv": (probs.transpose(-2, -1) @ do64).permute(0, 2, 1, 3),
    }
    want = {n: t.to(device) for n, t in want.items()}

    def ref(compute):
        return lambda q, k, v: TeRefCall(compute).run(case, q, k, v, kwargs, 0.0)[0]

    failures = []
    ref64 = grads(ref("float64"), torch.float64)
    ref_lp = grads(ref("same_precision"))
    for name, t in ref64.items():
        err = (t - want[name]).abs().max().item()
        if err > REF64_TOLERANCE:
            failures.append(f"te_ref float64 {name}: off the literal by {err:.3g}")
    impl = grads(lambda q, k, v: _adapter_run(adapter, case, q, k, v, kwargs, 0.0)[0])
    for name, t in impl.items():
        try:
            k_rule = K_FORWARD if name == "out" else K_BACKWARD
            check_ratio(name, t, want[name], ref_lp[name], k_rule, dtype)
        except AssertionError as e:
            failures.append(str(e))
    settle(adapter, case, failures, kwargs)
