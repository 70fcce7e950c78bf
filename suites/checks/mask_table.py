"""The semantics table: literal keep/drop grids for every mask type, alignment, window and shape.

Why: te_ref (te_ref/config.py + build_mask) and te_fast (te_fast/_arguments.py + its kernels and
_mask) each resolve a call's mask on their own, and the case matrices only compare the two. A
misreading they share (or a path the matrices never reach) passes there. Here the expected masks
are typed by hand from SPEC §2.3 and docs/SEMANTICS.md, as grids of '1' (kept) and '.' (masked
out), one row per query position i, one column per key position j: no formula of te_ref or
te_fast is used to make them.

How a mask is observed: q = 0 makes every score 0 (so does a softmax scale of exactly 0 with a
random q: the bshd_scale0 variant), so the softmax is uniform over the kept keys;
v = identity (dv = skv) makes each output row the probability row itself. A kept position then
reads exactly 1/n (n kept in the row; 1/(n+1) with the off-by-one sink) and a masked one exactly
0; a row with nothing kept is all 0 (SPEC §2.4, every path and dtype).

What is crossed:
- mask type (all 7) x bottom_right_diagonal (None, True, False) x window_size (the arguments a
  user may pass, -1 = unbounded: None, (-1,-1), (-1,0), (0,0), (1,0), (1,2), (0,-1), (-1,1) for
  non-causal types; None, (-1,-1), (-1,0), (0,0), (1,0), (0,-1), (1,-1) for causal types, whose
  right side is forced to 0) x shape (sq < skv: 3x5, sq = skv: 4x4, sq > skv: 5x3);
- batch element 0 full length, element 1 shorter (lengths chosen so that the bottom-right
  diagonal of the actual lengths differs from the padded one's), element 2 with no keys (lq = 2,
  lkv = 0), wherever lengths apply (padding types; every type on thd);
- variants reaching each code path of an implementation: bshd (te_fast hands causal types
  without a window to its causal kernels), sbhd with return_max_logit (explicit masks), padding
  lengths from attention_mask, the off-by-one sink softmax, thd and thd q with a bshd kv cache
  (lengths for every mask type), FP8, softmax_scale 0 with a random q; arbitrary masks per head
  [b, h, ...], per batch [1, 1, ...] and [1, h, ...];
- fp32, bf16 and fp16 (te_fast's kernels and GEMMs differ by dtype), on CPU and (marked gpu) on
  CUDA, through every selected adapter (--impl), and te_ref directly (float64 and the
  same-precision composite).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import pytest
import torch

import te_ref.fp8 as ref8
from te_conformance.reports import record
from te_conformance.suites import devices, features, skips
from te_conformance.suites import expected as expectations
from te_conformance.suites.adapters.base import Adapter
from te_conformance.suites.cases import DTYPES, AttnCase
from te_conformance.suites.checks import coverage
from te_conformance.suites.checks.failures import CheckError, raise_failures
from te_ref.layouts import PADDING_MASK_TYPES, parse_layout

SHAPES = {"3x5": (3, 5), "4x4": (4, 4), "5x3": (5, 3)}  # (sq, skv)


# (lq, lkv) of batch element 1 where lengths apply; element 0 is full, element 2 is (2, 0).
SHORT = {"3x5": (2, 3), "4x4": (3, 2), "5x3": (4, 3)}


NO_KEYS = (2, 0)


# Each block: "<shape> <full|short|left> <TL|BR>", the window (left, right) of each column, then
# the grids side by side ('1' kept, '.' masked out). "full": sq x skv real positions; "short":
# batch element 1's lengths (SHORT) at the start of the padded sq x skv grid (right padding);
# "left": the same counts at its end (left padding). The band is laid over the padded grid,
# i + off - left <= j <= i + off + right, and only real positions are kept. TL: off = 0; BR:
# off = lkv - lq, the element's counts of real positions (SPEC §2.3; TE 2.20.2 builds the band
# over the padded grid from the counts and ANDs the padding mask in: attention/
# dot_product_attention/utils.py get_full_mask, 2077-2126, called from backends.py:536-552).
BLOCKS = """
3x5 full TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
11111   1....  1.... 1.... 111..
11111   11...  .1... 11... 1111.
11111   111..  ..1.. .11.. .1111

3x5 full BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
11111   111..  ..1.. .11.. .1111
11111   1111.  ...1. ..11. ..111
11111   11111  ....1 ...11 ...11

3x5 short TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
111..   1....  1.... 1.... 111..
111..   11...  .1... 11... 111..
.....   .....  ..... ..... .....

3x5 short BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
111..   11...  .1... 11... 111..
111..   111..  ..1.. .11.. .11..
.....   .....  ..... ..... .....

4x4 full TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
1111    1...   1...  1...  111.
1111    11..   .1..  11..  1111
1111    111.   ..1.  .11.  .111
1111    1111   ...1  ..11  ..11

4x4 full BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
1111    1...   1...  1...  111.
1111    11..   .1..  11..  1111
1111    111.   ..1.  .11.  .111
1111    1111   ...1  ..11  ..11

4x4 short TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
11..    1...   1...  1...  11..
11..    11..   .1..  11..  11..
11..    11..   ....  .1..  .1..
....    ....   ....  ....  ....

4x4 short BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
11..    ....   ....  ....  11..
11..    1...   1...  1...  11..
11..    11..   .1..  11..  11..
....    ....   ....  ....  ....

5x3 full TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
111     1..    1..   1..   111
111     11.    .1.   11.   111
111     111    ..1   .11   .11
111     111    ...   ..1   ..1
111     111    ...   ...   ...

5x3 full BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
111     ...    ...   ...   1..
111     ...    ...   ...   11.
111     1..    1..   1..   111
111     11.    .1.   11.   111
111     111    ..1   .11   .11

5x3 short TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
111     1..    1..   1..   111
111     11.    .1.   11.   111
111     111    ..1   .11   .11
111     111    ...   ..1   ..1
...     ...    ...   ...   ...

5x3 short BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
111     ...    ...   ...   11.
111     1..    1..   1..   111
111     11.    .1.   11.   111
111     111    ..1   .11   .11
...     ...    ...   ...   ...

3x5 left TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
.....   .....  ..... ..... .....
..111   .....  ..... ..... ..11.
..111   ..1..  ..1.. ..1.. ..111

3x5 left BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
.....   .....  ..... ..... .....
..111   ..1..  ..1.. ..1.. ..111
..111   ..11.  ...1. ..11. ..111

4x4 left TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
....    ....   ....  ....  ....
..11    ....   ....  ....  ..11
..11    ..1.   ..1.  ..1.  ..11
..11    ..11   ...1  ..11  ..11

4x4 left BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
....    ....   ....  ....  ....
..11    ....   ....  ....  ..1.
..11    ....   ....  ....  ..11
..11    ..1.   ..1.  ..1.  ..11

5x3 left TL
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
...     ...    ...   ...   ...
111     11.    .1.   11.   111
111     111    ..1   .11   .11
111     111    ...   ..1   ..1
111     111    ...   ...   ...

5x3 left BR
(-1,-1) (-1,0) (0,0) (1,0) (1,2)
...     ...    ...   ...   ...
111     1..    1..   1..   111
111     11.    .1.   11.   111
111     111    ..1   .11   .11
111     111    ...   ..1   ..1
"""


# 'arbitrary': the user's mask ('x' = masked out by the user) and the expected grid of a head
# that has it, with no window ("none") and with the window (1,0) at either alignment.
# A head without the user's mask expects the "full" grids above.
ARBITRARY = """
3x5
user  none  TL(1,0) BR(1,0)
x.... .1111 .....   .11..
xxxxx ..... .....   .....
....x 1111. .11..   ...1.

4x4
user  none  TL(1,0) BR(1,0)
x...  .111  ....    ....
xxxx  ....  ....    ....
....  1111  .11.    .11.
...x  111.  ..1.    ..1.

5x3
user  none  TL(1,0) BR(1,0)
x..   .11   ...     ...
xxx   ...   ...     ...
...   111   .11     1..
...   111   ..1     11.
..x   11.   ...     .1.
"""


# The mask types: (lengths apply on bshd/sbhd, causal, the alignment the type forces or None).
# TE 2.20.2 DotProductAttention.forward, dot_product_attention.py:2400-2406: causal and
# padding_causal are top-left and the *_bottom_right types bottom-right whatever
# bottom_right_diagonal says; for the other types the argument decides, None meaning
# bottom-right (SPEC §2.3).
MASK_TYPES = {
    "no_mask": (False, False, None),
    "padding": (True, False, None),
    "causal": (False, True, "TL"),
    "padding_causal": (True, True, "TL"),
    "causal_bottom_right": (False, True, "BR"),
    "padding_causal_bottom_right": (True, True, "BR"),
    "arbitrary": (False, False, None),
}


ALIGNMENT = {None: "BR", True: "BR", False: "TL"}  # bottom_right_diagonal, where it decides




# window_size argument -> (the window applied, what the call does besides: "" nothing, "warn" a
# UserWarning, "error" raises). TE 2.20.2 check_set_window_size, attention/
# dot_product_attention/utils.py:2992-3034 (called at dot_product_attention.py:2397), with its
# table: no_mask/padding/arbitrary take (-1,-1) or (>=0,>=0); the causal types (-1,0) or (>=0,0).
NONCAUSAL_WINDOWS = {
    None: ((-1, -1), ""), (-1, -1): ((-1, -1), ""),
    (-1, 0): ((-1, -1), "warn"),  # no window, not a causal band (utils.py:3022-3027)
    (0, 0): ((0, 0), ""), (1, 0): ((1, 0), ""), (1, 2): ((1, 2), ""),
    (0, -1): (None, "error"), (-1, 1): (None, "error"),  # one unbounded side (utils.py:3028-3031)
}  # fmt: skip


CAUSAL_WINDOWS = {
    None: ((-1, 0), ""), (-1, 0): ((-1, 0), ""), (0, 0): ((0, 0), ""), (1, 0): ((1, 0), ""),
    # (-1,-1) or (>=0, !=0): the right side becomes 0, with a warning (utils.py:3009-3015)
    (-1, -1): ((-1, 0), "warn"), (0, -1): ((0, 0), "warn"), (1, -1): ((1, 0), "warn"),
    (1, 2): ((1, 0), "warn"),
    (-1, 1): (None, "error"),  # neither form (utils.py:3016-3019)
}  # fmt: skip


# arbitrary: window_size argument -> (ARBITRARY column by alignment, what the call does besides)
ARBITRARY_WINDOWS = {
    None: ({"TL": "none", "BR": "none"}, ""),
    (1, 0): ({"TL": "TL(1,0)", "BR": "BR(1,0)"}, ""),
    (0, -1): (None, "error"),
}


def _parse_blocks(text: str) -> dict:
    """{(shape, "full"|"short"|"left", "TL"|"BR", (left, right)): rows} from BLOCKS."""
    grids = {}
    for block in text.strip().split("\n\n"):
        header, windows, *rows = block.splitlines()
        shape, extent, alignment = header.split()
        for col, window in enumerate(windows.split()):
            key = (shape, extent, alignment, tuple(int(w) for w in window.strip("()").split(",")))
            grids[key] = tuple(row.split()[col] for row in rows)
    return grids


def _parse_arbitrary(text: str) -> dict:
    """{shape: {column: rows}} from ARBITRARY."""
    tables = {}
    for block in text.strip().split("\n\n"):
        shape, columns, *rows = block.splitlines()
        columns = columns.split()
        tables[shape] = {c: tuple(r.split()[i] for r in rows) for i, c in enumerate(columns)}
    return tables


GRIDS = _parse_blocks(BLOCKS)


ARBITRARY_GRIDS = _parse_arbitrary(ARBITRARY)


@dataclass(frozen=True)
class Variant:
    """One way of calling: the layout and the options that pick an implementation's path."""

    layout: str
    always_lengths: bool = False  # thd: sequence boundaries apply (it takes padding types only)
    # padding types on bshd/sbhd: "cu_seqlens" | "mask" (right padding) | "mask_left"
    padding_from: str = "cu_seqlens"
    softmax_type: str = "vanilla"
    max_logit: bool = False
    fp8: bool = False
    # the softmax scale: 1 with q = 0; exactly 0 with a random q (scores 0 whatever q and k
    # hold: TE 2.20.2 takes any float softmax_scale, dot_product_attention.py:943-947)
    scale: float = 1.0
    user_mask: str | None = "bh"  # arbitrary mask shape: "bh", "11", "1h"; None: no arbitrary
    mask_types: tuple[str, ...] = tuple(MASK_TYPES)
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")


VARIANTS = {
    "bshd": Variant("bshd_bshd_bshd"),
    "sbhd_max_logit": Variant("sbhd_sbhd_sbhd", max_logit=True, user_mask="11"),
    "bshd_padmask": Variant(
        "bshd_bshd_bshd", padding_from="mask", user_mask=None, mask_types=PADDING_MASK_TYPES,
    ),
    # a left-padded attention_mask masks exactly the positions it marks (SPEC §2.3; TE 2.20.2
    # ANDs the mask into the band, attention/dot_product_attention/utils.py:2116-2126)
    "bshd_leftpad": Variant(
        "bshd_bshd_bshd", padding_from="mask_left", user_mask=None, mask_types=PADDING_MASK_TYPES,
    ),
    "bshd_off_by_one": Variant("bshd_bshd_bshd", softmax_type="off-by-one", user_mask="1h"),
    # thd takes the padding types only (SPEC §1; TE 2.20.2 dot_product_attention.py:2449-2452);
    # the other types are error cases (test_thd_takes_padding_types_only)
    "thd": Variant("thd_thd_thd", always_lengths=True, user_mask=None,
                   mask_types=PADDING_MASK_TYPES),
    "thd_kvcache": Variant("thd_bshd_bshd", always_lengths=True, user_mask=None,
                           mask_types=PADDING_MASK_TYPES),
    "bshd_fp8": Variant("bshd_bshd_bshd", fp8=True, dtypes=("bf16",)),
    "bshd_scale0": Variant("bshd_bshd_bshd", scale=0.0),
}  # fmt: skip


ROWS = [
    pytest.param((name, mask, dtype), id=f"{mask}-{name}-{dtype}")
    for name, variant in VARIANTS.items()
    for mask in variant.mask_types
    for dtype in variant.dtypes
]


TOLERANCE = {"fp32": 1e-6, "fp16": 2e-3, "bf16": 1e-2}  # relative, on a kept 1/n


FP8_TOLERANCE = 0.25  # Q/K/V, S and O each quantized to E4M3


B, H, D = 3, 2, 4


def _lengths(shape: str, lengths_apply: bool) -> tuple[list[int], list[int]]:
    sq, skv = SHAPES[shape]
    if not lengths_apply:
        return [sq] * B, [skv] * B
    short_q, short_kv = SHORT[shape]
    return [sq, short_q, NO_KEYS[0]], [skv, short_kv, NO_KEYS[1]]


def cu_seqlens(lengths, device):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _identity_rows(lengths, skv, dtype, device):
    """thd v: token j of each sequence holds e_j (length skv)."""
    rows = [torch.eye(skv, dtype=dtype, device=device)[:n] for n in lengths]
    return torch.cat(rows).unsqueeze(1).expand(-1, H, -1).contiguous()  # (t, h, skv)


def _call_inputs(variant: Variant, mask_type: str, shape: str, dtype, device, lengths_apply):
    """(q, k, v, forward kwargs, lengths_q): q = 0 (random at scale 0), k random, v = identity
    over key positions."""
    sq, skv = SHAPES[shape]
    lq, lkv = _lengths(shape, lengths_apply)
    info = parse_layout(variant.layout)
    q_fmt, kv_fmt = info.q_format, info.kv_format
    eye = torch.eye(skv, dtype=dtype, device=device)  # (skv, skv): key j holds e_j

    def padded(fmt, s, dim, fill):  # (b, s, h, dim) or (s, b, h, dim)
        return fill(B, s, H, dim) if fmt == "bshd" else fill(s, B, H, dim)

    def zeros(*shape_):
        return torch.zeros(shape_, dtype=dtype, device=device)

    def randn(*shape_):  # k requires grad: the forward a training step runs (autograd)
        return torch.randn(shape_, device=device).to(dtype).requires_grad_()

    def q_fill(*shape_):  # scores of magnitude ~10, unless the scale makes them 0
        if variant.scale:
            return zeros(*shape_)
        return (torch.randn(shape_, device=device) * 3).to(dtype)

    kwargs: dict = {"qkv_layout": variant.layout, "attn_mask_type": mask_type}
    if q_fmt == "thd":
        q = q_fill(sum(lq), H, D)
        kwargs.update(cu_seqlens_q=cu_seqlens(lq, device), max_seqlen_q=sq,
                      cu_seqlens_kv=cu_seqlens(lkv, device))  # fmt: skip
    else:
        q = padded(q_fmt, sq, D, q_fill)
    if kv_fmt == "thd":
        k = randn(sum(lkv), H, D)
        v = _identity_rows(lkv, skv, dtype, device)
        kwargs["max_seqlen_kv"] = skv
    else:
        k = padded(kv_fmt, skv, D, randn)
        v_bshd = eye.view(1, skv, 1, skv).expand(B, skv, H, skv)
        v = (v_bshd if kv_fmt == "bshd" else v_bshd.transpose(0, 1)).contiguous()
    if q_fmt != "thd" and lengths_apply:
        if variant.padding_from in ("mask", "mask_left"):
            ar_q, ar_kv = torch.arange(sq, device=device), torch.arange(skv, device=device)
            nq, nkv = torch.tensor(lq, device=device)[:, None], torch.tensor(lkv, device=device)
            if variant.padding_from == "mask":  # True = padding: past each length
                mq, mkv = ar_q[None, :] >= nq, ar_kv[None, :] >= nkv[:, None]
            else:  # before the last `length` positions
                mq, mkv = ar_q[None, :] < sq - nq, ar_kv[None, :] < skv - nkv[:, None]
            kwargs["attention_mask"] = (mq.view(B, 1, 1, sq), mkv.view(B, 1, 1, skv))
        else:
            kwargs.update(cu_seqlens_q=cu_seqlens(lq, device),
                          cu_seqlens_kv=cu_seqlens(lkv, device))  # fmt: skip
    return q, k, v, kwargs, lq


def _user_mask(variant: Variant, shape: str, device):
    """The arbitrary mask: head 0 carries the user's 'x' cells, head 1 none (or every head)."""
    sq, skv = SHAPES[shape]
    rows = ARBITRARY_GRIDS[shape]["user"]
    user = torch.tensor([[c == "x" for c in r] for r in rows], device=device)  # (sq, skv)
    if variant.user_mask == "11":
        return user.view(1, 1, sq, skv)
    per_head = torch.stack([user, torch.zeros_like(user)]).view(1, H, sq, skv)
    return per_head.expand(B, H, sq, skv).contiguous() if variant.user_mask == "bh" else per_head


def _probabilities(variant: Variant, out: torch.Tensor, shape: str, lq) -> torch.Tensor:
    """The output as probabilities (b, h, sq, skv): out rows are probability rows (v = I)."""
    sq, skv = SHAPES[shape]
    q_fmt = parse_layout(variant.layout).q_format
    out = out.detach().double()
    if q_fmt == "bshd":
        return out.view(B, sq, H, skv).permute(0, 2, 1, 3)
    if q_fmt == "sbhd":
        return out.view(sq, B, H, skv).permute(1, 2, 0, 3)
    probs = out.new_zeros(B, H, sq, skv)  # thd: rows past a sequence's length do not exist
    start = 0
    for x, n in enumerate(lq):
        probs[x, :, :n] = out[start : start + n].view(n, H, skv).transpose(0, 1)
        start += n
    return probs


def _outcome(mask_type: str, window_arg) -> str:
    """What the call does besides computing: "", "warn" or "error" (the window tables)."""
    if mask_type == "arbitrary":
        return ARBITRARY_WINDOWS[window_arg][1]
    return (CAUSAL_WINDOWS if MASK_TYPES[mask_type][1] else NONCAUSAL_WINDOWS)[window_arg][1]


def _expected(variant: Variant, mask_type: str, shape: str, diag, window_arg):
    """[batch][head] -> rows, from the literal tables only (calls that raise have none)."""
    lengths_apply, causal, forced = MASK_TYPES[mask_type]
    lengths_apply = lengths_apply or variant.always_lengths
    alignment = forced or ALIGNMENT[diag]
    window = (CAUSAL_WINDOWS if causal else NONCAUSAL_WINDOWS)[window_arg][0]
    full = GRIDS[(shape, "full", alignment, window)]
    if lengths_apply:
        no_keys = tuple("." * SHAPES[shape][1] for _ in range(SHAPES[shape][0]))
        extent = "left" if variant.padding_from == "mask_left" else "short"
        batch = [full, GRIDS[(shape, extent, alignment, window)], no_keys]
    else:
        batch = [full] * B
    if mask_type != "arbitrary":
        return [[rows] * H for rows in batch]
    user = ARBITRARY_GRIDS[shape][ARBITRARY_WINDOWS[window_arg][0][alignment]]
    heads = [user, user] if variant.user_mask == "11" else [user, full]
    return [heads] * B


def _windows(mask_type: str):
    if mask_type == "arbitrary":
        return list(ARBITRARY_WINDOWS)
    return list(CAUSAL_WINDOWS if MASK_TYPES[mask_type][1] else NONCAUSAL_WINDOWS)


# How _render draws a probability that is no finite number (a NaN row must not read as kept).
NONFINITE = {"N": "NaN", "I": "inf or -inf"}


def _cell(x: float) -> str:
    if math.isnan(x):
        return "N"
    if math.isinf(x):
        return "I"
    return "." if x == 0 else "1"


def _render(p: torch.Tensor) -> str:
    """The observed grid: '1' where the probability is a nonzero number, '.' where it is exactly
    0, 'N' where it is NaN and 'I' where it is infinite (with a legend when any is)."""
    grid = " ".join("".join(_cell(float(x)) for x in row) for row in p)
    legend = ", ".join(f"{c} = {what}" for c, what in NONFINITE.items() if c in grid)
    return grid + (f" ({legend})" if legend else "")


def _compare(p, rows, sink: int, tol: float) -> bool:
    """p (sq, skv) is exactly 0 where rows say '.' and 1/(n + sink) within tol where '1'."""
    keep = torch.tensor([[c == "1" for c in r] for r in rows], device=p.device)
    n = keep.sum(-1, keepdim=True).double()
    want = torch.where(keep, 1.0 / (n + sink), torch.zeros_like(n))
    if (p[~keep] != 0).any():
        return False
    return bool(((p - want).abs() <= tol * want)[keep].all())


def _call(adapter, case, q, k, v, kwargs, scale=1.0):
    """(out, the window warnings the call gave)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = adapter.call(adapter.build(case, scale), case, q, k, v, kwargs)[0]
    return out, [w for w in caught if "window_size should be" in str(w.message)]


def _check_one(adapter, variant, case, shape, device) -> tuple[list[str], list[str], set]:
    """One call (one shape, alignment override and window): (what differs from the table that
    no recorded deviation explains, what differs where the adapter's hook names deviations for
    the call, those deviations). A call the deviations cover must differ: one that matches the
    table is reported (a fixed deviation is noticed)."""
    dtype = DTYPES[case.dtype]
    mask_type, diag, window_arg = case.mask_type, case.bottom_right_diagonal, case.window
    lengths_apply = MASK_TYPES[mask_type][0] or variant.always_lengths
    q, k, v, kwargs, lq = _call_inputs(variant, mask_type, shape, dtype, device, lengths_apply)
    if mask_type == "arbitrary":
        kwargs["attention_mask"] = _user_mask(variant, shape, device)
    if window_arg is not None:
        kwargs["window_size"] = window_arg
    if diag is not None:
        kwargs["bottom_right_diagonal"] = diag
    if variant.fp8:
        recipe = adapter.fp8_recipe(ref8.DelayedScaling(fp8_format="E4M3"))
        kwargs.update(fp8=True, fp8_meta={"recipe": recipe})
    where = f"{shape} bottom_right_diagonal={diag} window_size={window_arg}"
    outcome = _outcome(mask_type, window_arg)
    if outcome == "error":
        errors = adapter.argument_errors
        try:
            _call(adapter, case, q, k, v, kwargs, variant.scale)
        except errors:
            return [], [], set()
        except Exception as e:  # any other exception is a finding
            return [f"{where}: expected {errors}, got {type(e).__name__}: {e}"], [], set()
        return [f"{where}: expected an error (the window tables), the call returned"], [], set()
    out, warned = _call(adapter, case, q, k, v, kwargs, variant.scale)
    failures = []
    if bool(warned) != (outcome == "warn"):
        said = f"warned {str(warned[0].message)!r}" if warned else "gave no warning"
        failures.append(
            f"{where}: the window tables say {outcome or 'no warning'}, the call {said}"
        )
    probs = _probabilities(variant, out, shape, lq)
    sink = 1 if variant.softmax_type == "off-by-one" else 0
    tol = FP8_TOLERANCE if variant.fp8 else TOLERANCE[case.dtype]
    expected = _expected(variant, mask_type, shape, diag, window_arg)
    for x in range(B):
        for hh in range(H):
            rows, p = expected[x][hh], probs[x, hh]
            if _compare(p, rows, sink, tol):
                continue
            got = _render(p)
            if got == " ".join(rows):
                values = " ".join(f"{float(val):.3g}" for val in p.flatten())
                got += f" (kept right, values not 1/n: {values})"
            failures.append(f"{where} batch {x} head {hh}: expected {' '.join(rows)}, got {got}")
    deviations = adapter.known_deviations(
        case, lengths=_lengths(shape, lengths_apply), expected=expected, call_kwargs=kwargs
    )
    if not deviations:
        return failures, [], set()
    if failures:
        return [], failures, set(deviations)
    ids = ", ".join(getattr(d, "id", str(d)) for d in deviations)
    fixed = f"{where}: recorded deviation {ids} predicted, but every grid matches the table"
    return [fixed], [], set()


def run_table(adapter: Adapter, variant_name: str, mask_type: str, dtype_name: str, device_name):
    """Every (shape, bottom_right_diagonal, window) of one variant and mask type through
    ``adapter``; fails listing each mismatching grid (expected vs observed). The mismatches of
    the calls the adapter's hook names deviations for (SPEC §7) are "table" failures those
    deviations explain (suites/expected.py): where they are all, an expected failure."""
    variant = VARIANTS[variant_name]
    record.case(
        impl=adapter.name, layout=variant.layout, dtype=dtype_name, mask_type=mask_type,
        softmax_type=variant.softmax_type, device=device_name, table=variant_name,
    )  # fmt: skip
    asked = AttnCase(
        variant.layout, dtype_name, mask_type, device=device_name,
        softmax_type=variant.softmax_type, return_max_logit=variant.max_logit,
    )  # fmt: skip
    if variant.fp8:
        features.record_features("fp8")
    else:  # the calls' own features (v is the identity: no MLA case)
        features.record_case_features(asked, identity_v=True)
    device = devices.require(device_name, needs_te_fast=False)
    skips.unless("environment", [adapter.unavailable_reason(device_name)])
    failures, explained, deviations, skipped, ran, not_judged = [], [], set(), set(), 0, {}
    for shape, (sq, skv) in SHAPES.items():
        for diag in (None, True, False):
            for window_arg in _windows(mask_type):
                case = AttnCase(
                    variant.layout, dtype_name, mask_type, device=device_name, b=B, sq=sq,
                    skv=skv, h=H, hg=H, d=D, dv=skv, window=window_arg,
                    bottom_right_diagonal=diag, softmax_type=variant.softmax_type,
                    padding_from=variant.padding_from, return_max_logit=variant.max_logit,
                )  # fmt: skip
                # max_logit left out where the adapter returns none (suites/checks/coverage.py)
                as_run = coverage.runnable(adapter, case)
                reasons = adapter.declines(case) if as_run is None else []
                if variant.fp8:
                    reasons += adapter.declines(needs=("fp8",), device=device_name)
                if reasons:
                    skipped.update(reasons)
                    continue
                case, notes = as_run
                not_judged.update(notes.get("not_judged", {}))
                found, deviating, named = _check_one(adapter, variant, case, shape, device)
                failures += found
                explained += deviating
                deviations |= named
                ran += 1
    if not_judged:  # the variant's calls were made without asking for it
        record.case(not_judged=not_judged)
        if not variant.fp8:  # max_logit's row: not supported here, not passed
            kept = [k for k in features.case_features(asked, identity_v=True)
                    if k not in not_judged]  # fmt: skip
            features.record_features(*kept, replace=True, declined=dict(not_judged))
    if not ran:
        skips.skip("declined", sorted(skipped, key=str))
    expectations.expect(*(expectations.from_deviation(d, adapter.name) for d in deviations))
    problems = []
    if failures:
        problems.append(AssertionError(
            f"{len(failures)} grids differ from the table:\n" + "\n".join(failures[:24])
        ))  # fmt: skip
    if explained:
        problems.append(CheckError.new("table", "out", (
            f"{len(explained)} grids differ from the table where recorded deviations are "
            "named:\n" + "\n".join(explained[:24])
        )))  # fmt: skip
    raise_failures(problems)
