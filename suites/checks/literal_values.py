"""The semantics table's values: ALiBi slopes and bias matrices, pre- and post-scale bias,
max_logit under masks, the sink softmax's denominators and the softmax scale at 0 and below,
as literals typed by hand from Transformer Engine 2.20.2's formulas.

Why: te_ref and te_fast each code the slope series, the bias formulas, max_logit and the sink,
and the attention suites compare the two with each other; a misreading both share passes
there (the second slope series changed from 2^(-4k/n) to 2^(-8k/n) in both passed every ALiBi
case). The mask table (suites/checks/mask_table.py) pins the masks; this file pins the values.
No expected value comes from te_ref or te_fast: each is a literal below, or torch.softmax / amax
/ a product of literals (the definition, one line, in float64). TE's lines (paths relative to
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
from dataclasses import replace

import torch

from te_conformance.reports import record
from te_conformance.suites import expected as expectations
from te_conformance.suites import features, skips
from te_conformance.suites.adapters import ready
from te_conformance.suites.adapters.te_ref import TeRef
from te_conformance.suites.cases import DTYPES, AttnCase
from te_conformance.suites.checks import coverage
from te_conformance.suites.checks.failures import CheckError, raise_failures
from te_conformance.suites.checks.numerics import K_FORWARD, check_ratio

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


def _as_run(adapter, case: AttnCase) -> tuple[AttnCase, dict]:
    """(the case as the adapter runs it, what the report records): max_logit left out where the
    adapter returns none (suites/checks/coverage.py); the case itself where it cannot run."""
    return coverage.runnable(adapter, case) or (case, {})


def run_call(adapter, case: AttnCase, q, k, v, kwargs, scale):
    """(out, max_logit or None) of one call through ``adapter`` (a fresh module), the window
    warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, max_logit, _ = adapter.call(adapter.build(case, scale), case, q, k, v, dict(kwargs))
    return out, max_logit


def reference_call(compute: str, case: AttnCase, q, k, v, kwargs, scale):
    """te_ref's (out, max_logit), in float64 or as the same-precision composite."""
    return run_call(TeRef(compute), replace(case, return_max_logit=True), q, k, v, kwargs, scale)


def _probabilities(out: torch.Tensor, case: AttnCase) -> torch.Tensor:
    """bshd output (b, sq, h * skv) with v = identity -> probabilities (b, h, sq, skv)."""
    return out.detach().view(case.b, case.sq, case.h, case.skv).permute(0, 2, 1, 3)


def pin_inputs(case: AttnCase, q_rows, k_rows, device):
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
    only where it returns one (te_ref's always). Returns the failures: the adapter's as
    CheckErrors (a recorded deviation may explain them), te_ref's own as plain assertions
    (nothing explains the judge's)."""
    failures = []
    run, notes = _as_run(adapter, case)
    ref64 = reference_call("float64", case, q, k, v, kwargs, scale)
    ref_lp = reference_call("same_precision", case, q, k, v, kwargs, scale)
    for name, (out, ml) in (("te_ref float64", ref64), ("te_ref same precision", ref_lp)):
        p = _probabilities(out, case).double()
        tol = REF64_TOLERANCE if out.dtype == torch.float64 else LP_TOLERANCE[case.dtype]
        err = ((p - probs64).abs() / probs64.abs().clamp_min(1e-300)).max().item()
        if err > tol:
            failures.append(AssertionError(
                f"{name}: probabilities off the literal by {err:.3g} (relative)"))  # fmt: skip
        if max_logit64 is not None and (ml.double() - max_logit64).abs().max().item() > tol:
            failures.append(AssertionError(
                f"{name}: max_logit {ml.tolist()}, literal {max_logit64.tolist()}"))  # fmt: skip
    out, max_logit = run_call(adapter, run, q, k, v, kwargs, scale)
    checks = [("out", _probabilities(out, case), probs64, _probabilities(ref_lp[0], case))]
    if max_logit64 is not None and "max_logit" not in notes.get("not_judged", {}):
        if max_logit is None or max_logit.shape != (case.h,) or max_logit.dtype != torch.float32:
            got = None if max_logit is None else (tuple(max_logit.shape), max_logit.dtype)
            message = f"max_logit must be fp32 [h] (SPEC §1), got {got}"
            failures.append(CheckError.new("dtype", "max_logit", message))
        else:
            checks.append(("max_logit", max_logit, max_logit64, ref_lp[1]))
    for name, impl, lit, lp in checks:
        try:
            check_ratio(name, impl, lit, lp, K_FORWARD, DTYPES[case.dtype])
        except AssertionError as e:
            failures.append(e)
    return failures


def within(where: str, failures: list[AssertionError]) -> list[AssertionError]:
    """The failures with ``where`` before their message (a CheckError keeps kind and tensor)."""
    return [
        CheckError.new(f.kind, f.tensor, f"{where}: {f}") if isinstance(f, CheckError)
        else AssertionError(f"{where}: {f}")
        for f in failures
    ]  # fmt: skip


def settle(adapter, case: AttnCase, failures: list[AssertionError], kwargs=None) -> None:
    """Fail with the differences from the literals; the deviations the adapter's hook names for
    the case as it ran (SPEC §7) are expected (suites/expected.py: it must differ, and only in
    the adapter's values)."""
    deviations = adapter.known_deviations(_as_run(adapter, case)[0], call_kwargs=kwargs)
    expectations.expect(*(expectations.from_deviation(d, adapter.name) for d in deviations))
    raise_failures(failures)


def start_pin(adapter, case: AttnCase, table: str) -> torch.device:
    """Record a literal pin's case and its features (v is the identity: no MLA case); its
    device, or a skip recorded with its kind where nothing of the case runs on the adapter
    here (max_logit is left out where the adapter returns none: not_judged)."""
    record.case(impl=adapter.name, **case.fields(), table=table)
    features.record_case_features(case, identity_v=True)
    found = coverage.runnable(adapter, case)  # None: nothing of the case runs on the adapter
    if found is None:
        skips.skip("declined", adapter.declines(case))
    if found[1]:
        record.case(**found[1])  # not_judged: max_logit, where the adapter returns none
        features.record_substitute(case, found[0], adapter.declines(case), identity_v=True)
    return ready(adapter, found[0])


DTYPE_NAMES = ("fp32", "bf16", "fp16")


def softmax64(scores, keep=None):
    """softmax over the last dim of float64 scores; keep (bool) marks the kept positions."""
    s = torch.as_tensor(scores, dtype=torch.float64)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1)


def keep_mask(mask: str, device) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in KEEP[mask]], device=device)
