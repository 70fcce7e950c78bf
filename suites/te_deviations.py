"""TE deviations (SPEC §7): where Transformer Engine 2.20.2's code departs from its own
documentation or from its fused softmax kernel, for the transformer_engine adapter only.

Kept next to suites/known_failures.py. Each entry has its TE source lines, the smallest
reproducer (``python -m te_conformance.suites.te_deviations <ID>`` runs TE, through the CPU
stand-in where there is no CUDA, and prints TE's probability grid next to the documented one:
q = 0, v = identity, so each output row is the probability row), the grids it printed, the
diagnosis, and which cases it explains. A case it explains carries its expectation
(``Deviation.expectation``, suites/expected.py): STRICT and NARROW, the case must differ, so that
a TE release that fixes it shows up as a failure ("no longer shows"), and only in the checks the
entry's ``explains`` names (the value comparisons, the mask table, a refusal; M1: max_logit's
dtype), so that any other failure of the case still fails. The report lists each with its id,
title, TE lines and reproducer, from the records alone. docs/transformer_engine.md has the same
list.

Which cases: ``explain`` models what TE's unfused backend does with a case's mask, row by row
(utils.py get_full_mask 1977-2126, backends.py 536-552 and 669-742, softmax.py 354-384), once as
documented and once with each of TE's readings below, and names every reading that changes a
row of the output that the suites see (for thd, the real query rows: the others are dropped by
TE's convert_bshd_to_thd). A change counts only where it shows in the numbers: a key whose V is
zero (thd's padded keys) changes a row only through the softmax's denominator, and a changed
ALiBi offset only where it is not a constant shift of the row's kept scores.

TE paths are relative to ``transformer_engine/`` of the 2.20.2 wheel; ``dpa.py`` is
``pytorch/attention/dot_product_attention/dot_product_attention.py``, and ``utils.py``,
``backends.py``, ``softmax.py`` are in that folder.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from te_conformance.suites.cases import AttnCase

TE_RELEASE = "2.20.2"


@dataclass(frozen=True)
class Deviation:
    """One recorded departure of TE's code from its documentation or its fused kernel."""

    id: str
    title: str
    te_lines: str  # file:lines in TE 2.20.2
    diagnosis: str
    grid: str  # what the reproducer printed: TE's probability grid and the documented one
    reproducer: dict = field(repr=False, compare=False, default_factory=dict)
    kind: str = "TE deviation"  # or "TE fallback": the torch fallback's own outcome
    # the failures it explains (suites/expected.py): check kinds on any tensor, or
    # "kind:tensor"; a case failing otherwise fails the test. By default the value checks, the
    # mask table's grids and a refusal that did not happen (expected.DEVIATION_EXPLAINS)
    explains: tuple[str, ...] = ("ratio", "zero_rows", "table", "refusal")

    @property
    def reproducer_command(self) -> str:
        return f"python -m te_conformance.suites.te_deviations {self.id}"

    def expectation(self, adapter: str | None = "transformer_engine"):
        """The expectation a case it explains carries (suites/expected.py): failures of the
        checks it ``explains``, on any tensor."""
        from te_conformance.suites.expected import Expectation

        return Expectation(
            source="te_deviation", id=self.id, reason=self.diagnosis, checks=self.explains,
            adapter=adapter, title=self.title, where=self.te_lines,
            reproducer=self.reproducer_command,
        )  # fmt: skip

    @property
    def reason(self) -> str:
        return str(self)

    def __str__(self) -> str:
        """One line: what it is, TE's lines and its reproducer (the CLI's listing)."""
        head = self.kind if self.kind == "TE fallback" else f"{self.kind} {self.id}"
        return f"{head}: {self.title} [TE {self.te_lines}] reproducer: {self.reproducer_command}"


# ----------------------------------------------------------------------------- the registry

DEVIATIONS: dict[str, Deviation] = {}


def _add(dev: Deviation) -> Deviation:
    DEVIATIONS[dev.id] = dev
    return dev


D1 = _add(Deviation(
    id="D1",
    title="an unbounded window side becomes max_seqlen_kv (left) / max_seqlen_q (right), too "
    "short under top-left alignment",
    te_lines="pytorch/attention/dot_product_attention/utils.py:2068-2071",
    diagnosis="get_full_mask replaces window_size[0] == -1 by max_seqlen_kv and window_size[1] "
    "== -1 by max_seqlen_q before laying the band. Under bottom-right alignment those bounds "
    "are wide enough; under top-left alignment row i needs a left bound >= sq - 1 and a right "
    "bound >= skv - 1, so the bounds are swapped: with sq > skv + 1 the last rows lose their "
    "first keys, with skv > sq + 1 the first rows lose their last keys. The docstring (dpa.py "
    "window_size, utils.py get_full_mask): '(-1, -1) and (-1, 0) mean no sliding window and "
    "causal mask specifically'. Hits causal/padding_causal (always top-left) with sq > skv + 1 "
    "and padding/arbitrary with bottom_right_diagonal=False and |sq - skv| > 1 (no_mask takes "
    "no mask at all, softmax.py:377). A fix: max(max_seqlen_q, max_seqlen_kv) for both sides.",
    grid="causal, sq=5, skv=3, batch 0 head 0:\n"
    "TE        [[1, 0, 0], [.5, .5, 0], [.333, .333, .333], [.333, .333, .333], [0, .5, .5]]\n"
    "documented[[1, 0, 0], [.5, .5, 0], [.333, .333, .333], [.333, .333, .333], "
    "[.333, .333, .333]]",
    reproducer=dict(mask="causal", sq=5, skv=3),
))

D2 = _add(Deviation(
    id="D2",
    title="self attention takes the query padding for the keys too, cu_seqlens_kv ignored",
    te_lines="pytorch/attention/dot_product_attention/utils.py:1966-1969,2077-2080",
    diagnosis="get_padding_mask returns only the query mask when attention_type='self', and "
    "get_full_mask ORs it in as rows and as columns: key j of batch element x is padding iff "
    "j >= seqlen_q[x], whatever cu_seqlens_kv says (the fused backends take both). The "
    "DotProductAttention docstring gives padding 'via cu_seqlens_q and cu_seqlens_kv' (SPEC "
    "§2.3: key column j is padding iff j >= seqlen_kv). Real keys past seqlen_q are dropped; "
    "with seqlen_kv < seqlen_q, padding keys (zeros on thd) are attended; the bottom-right "
    "diagonal and ALiBi take seqlen_q for both lengths. attention_type='cross' reads both. With "
    "masks, TE's self attention takes one [b, 1, 1, sq] mask for both (its docstring); a call "
    "giving a (q, kv) pair that differs in self attention is passed in that form (the query "
    "mask) by the adapter and meets the same reading.",
    grid="thd padding, cu_seqlens_q=[0,2,6], cu_seqlens_kv=[0,4,5], max_seqlen 4, batch 0:\n"
    "TE        [[.5, .5, 0, 0], [.5, .5, 0, 0]]\n"
    "documented[[.25, .25, .25, .25], [.25, .25, .25, .25]]",
    reproducer=dict(mask="padding", sq=4, skv=4, thd=True, lq=(2, 4), lkv=(4, 1)),
))

D3 = _add(Deviation(
    id="D3",
    title="left-padded masks: the lengths are read from row 0 / column 0 of the combined mask",
    te_lines="pytorch/attention/dot_product_attention/utils.py:2085-2087",
    diagnosis="get_full_mask takes actual_seqlens_q = m[:, 0, :, 0].sum() and actual_seqlens_kv "
    "= m[:, 0, 0, :].sum() of the combined (query rows AND key columns) mask: where the first "
    "key (or query) position is padding both counts are 0, so the bottom-right diagonal of "
    "padding/padding_causal_bottom_right and the ALiBi offsets move (get_alibi gets the same "
    "lengths). get_full_mask's docstring: the diagonal 'comes from the bottom right corner of "
    "the [actual_seqlens_q[i], actual_seqlens_kv[i]] matrix'; SPEC §2.3: the counts of unmarked "
    "positions. Self attention is unaffected (the offset is 0 either way); cross is.",
    grid="cross padding_causal_bottom_right, sq=3, skv=4, q mask [T,F,F], kv mask [T,F,F,F]:\n"
    "TE        [[0, 0, 0, 0], [0, 1, 0, 0], [0, .5, .5, 0]]\n"
    "documented[[0, 0, 0, 0], [0, .5, .5, 0], [0, .333, .333, .333]]",
    reproducer=dict(mask="padding_causal_bottom_right", sq=3, skv=4, left=True, lq=(2,),
                    lkv=(3,)),  # fmt: skip
))

D4 = _add(Deviation(
    id="D4",
    title="the ALiBi bias is cached across calls whose actual lengths differ",
    te_lines="pytorch/attention/dot_product_attention/dot_product_attention.py:2689-2701; "
    "utils.py:2201-2216",
    diagnosis="DotProductAttention invalidates the module-global _alibi_cache only when the "
    "head count, max_seqlen_q/kv, the alignment or the slopes change (user slopes with "
    "layer_number 1 always reset it), but get_alibi bakes each batch element's offset "
    "seqlen_kv - seqlen_q into the cached bias: a later call with the same shapes and other "
    "lengths reuses the old offsets. The adapter resets the cache before every call (what a "
    "fresh process sees), so the suites' cases do not meet D4; tests/test_te_adapter.py "
    "shows it with two calls on one module.",
    grid="cross padding ALiBi, sq=skv=3; call 1 lengths (3,3), call 2 lengths (1,3), row 0:\n"
    "TE        [.335, .333, .332] (call 1's offset 0)\n"
    "documented[.332, .333, .335] (offset 2)",
    reproducer=dict(mask="padding", sq=3, skv=3, alibi=True, cross=True, lq=(1,), lkv=(3,),
                    first=((3,), (3,))),  # fmt: skip
))

D5 = _add(Deviation(
    id="D5",
    title="attention_mask given with a causal type is applied, not ignored or refused",
    te_lines="pytorch/attention/dot_product_attention/backends.py:536-552; utils.py:2116-2119; "
    "softmax.py:365-374",
    diagnosis="The DotProductAttention docstrings: attention_mask 'is only used when "
    "attn_mask_type includes padding or arbitrary' and 'should be None for causal masks and "
    "no_mask'. TE neither refuses nor ignores it: get_full_mask ORs it into the causal/window "
    "mask and the causal softmax applies it (with no_mask too once a window makes the type "
    "'arbitrary', utils.py:2123). te_ref refuses it (docs/SEMANTICS.md), as 'should be None' "
    "asks. No numeric suite passes such a mask; the semantics table's refusal cases show it.",
    grid="causal, sq=skv=3, attention_mask column 0 True:\n"
    "TE        [[.333, .333, .333], [0, 1, 0], [0, .5, .5]]\n"
    "documented[[1, 0, 0], [.5, .5, 0], [.333, .333, .333]] (the mask unused; te_ref refuses it)",
    reproducer=dict(mask="causal", sq=3, skv=3, user_column0=True),
))

D6 = _add(Deviation(
    id="D6",
    title="a sliding window on a padding type drops the actual lengths from ALiBi",
    te_lines="pytorch/attention/dot_product_attention/utils.py:2061-2063,2122-2123; "
    "backends.py:669-676",
    diagnosis="With a window (other than (-1, -1) / (-1, 0)) get_full_mask returns the type "
    "'arbitrary', and the unfused backend then gives get_alibi actual lengths only 'if "
    "\"padding\" in attn_mask_type': the ALiBi offset of a bottom-right padding type becomes "
    "max_seqlen_kv - max_seqlen_q instead of each element's seqlen_kv - seqlen_q (SPEC §2.2, "
    "the mask itself keeps the actual lengths). Same root as the fallback's padded rows.",
    grid="cross padding_causal_bottom_right, window (2, 0), ALiBi, sq=skv=4, lengths q 2 / "
    "kv 4, rows 0-1 (rows 2-3 are padding, uniform: the fallback outcome):\n"
    "TE        [[.335, .333, .332, 0], [0, .335, .333, .332]] (offset 0)\n"
    "documented[[.332, .333, .335, 0], [0, .332, .333, .335]] (offset 2)",
    reproducer=dict(mask="padding_causal_bottom_right", sq=4, skv=4, alibi=True, cross=True,
                    lq=(2,), lkv=(4,), window=(2, 0)),  # fmt: skip
))

M1 = _add(Deviation(
    id="M1",
    title="max_logit comes in O's dtype (fp16/bf16) where SPEC §1 says fp32: an open SPEC question",
    te_lines="pytorch/cpp_extensions/fused_attn.py:322; "
    "pytorch/attention/dot_product_attention/backends.py:711-717",
    diagnosis="Not TE against its own documentation: the fused path's docstring says max_logit "
    "has 'the same data type as O' (cpp_extensions/fused_attn.py:322) and the unfused backend "
    "takes the max of the scores in the input dtype (backends.py:711-717). SPEC §1 asks for "
    "fp32 [h]; DotProductAttention's own docstring names no dtype. Under SPEC §7 TE's "
    "documented behaviour would win, but the SPEC is kept byte for byte with the project's "
    "../shared/SPEC.md, so the conflict is recorded here, open, until the SPEC says which. The "
    "values agree to the dtype's precision; only the dtype differs.",
    grid="bf16 q, k, v, return_max_logit=True: TE max_logit torch.bfloat16, documented "
    "(SPEC §1) torch.float32",
    reproducer=dict(max_logit_dtype=True),
    explains=("dtype:max_logit",),
))

FALLBACK = _add(Deviation(
    id="fallback",
    kind="TE fallback",
    title="fully masked rows come out uniform (1/skv) from TE's torch softmax fallback, 0 from "
    "its fused kernel",
    te_lines="pytorch/utils.py:295; pytorch/attention/dot_product_attention/softmax.py:354-384; "
    "utils.py:2123; backends.py:712-716,741-742",
    diagnosis="TE's mask function fills masked scores with -10000 (pytorch/utils.py:295) and "
    "the fallback takes torch.softmax: a row with every key masked is uniform over all skv "
    "keys (the output is the mean of V) where TE's fused softmax kernel and the SPEC (§2.4) "
    "give 0. TE zeroes such rows afterwards only for padding types (backends.py:741-742); a "
    "window turns a padding type into 'arbitrary' (utils.py:2123), so then padded query rows "
    "stay uniform too (output and dV non-zero, SPEC §2.5). return_max_logit of a head with "
    "every position masked is -10000 (backends.py:712-716), not -inf. The sink softmaxes "
    "(off-by-one, learnable) have no such rows: the sink takes the mass. Through the CPU "
    "stand-in every case takes the fallback (NVTE_MASKED_SOFTMAX_FUSION=0); with the real TE "
    "only those its is_kernel_available turns away (fp32, shapes off the kernel's sizes).",
    grid="causal_bottom_right, sq=3, skv=2: TE [[.5, .5], [1, 0], [.5, .5]], documented "
    "[[0, 0], [1, 0], [.5, .5]]; padding_causal window (1, 0), sq=skv=3, lengths 2: TE row 2 "
    "[.333, .333, .333], documented 0; max_logit of a fully masked head: TE -10000, documented "
    "-inf",
    reproducer=dict(mask="causal_bottom_right", sq=3, skv=2),
))


# ----------------------------------------------------------------------------- TE's reading


def te_window(mask_type: str, window):
    """TE's check_set_window_size (utils.py:2992-3034): the window it passes on, or None
    where it asserts."""
    if window is None:
        return (-1, 0) if "causal" in mask_type else (-1, -1)
    left, right = (int(w) for w in window)
    if "causal" in mask_type:
        if (left, right) == (-1, 0) or (left >= 0 and right == 0):
            return left, right
        if (left, right) == (-1, -1) or left >= 0:
            return left, 0
        return None
    if (left, right) == (-1, -1) or (left >= 0 and right >= 0):
        return left, right
    if (left, right) == (-1, 0):
        return -1, -1
    return None


def te_bottom_right(mask_type: str, diagonal) -> bool:
    """DotProductAttention.forward's alignment (dpa.py:2398-2406)."""
    if mask_type in ("causal", "padding_causal"):
        return False
    if mask_type in ("causal_bottom_right", "padding_causal_bottom_right"):
        return True
    return True if diagonal is None else bool(diagonal)


def te_final_mask_type(case: AttnCase, window=None) -> str:
    """The type TE's unfused softmax sees: 'arbitrary' once a window is set (utils.py:2061-2063,
    2123) or with a sink softmax (backends.py:720-731)."""
    window = te_window(case.mask_type, case.window if window is None else window)
    if case.softmax_type != "vanilla":
        return "arbitrary"
    if window is not None and (window[0] != -1 or window[1] not in (-1, 0)):
        return "arbitrary"
    return case.mask_type


def _band(sq, skv, window, offset, unbounded):
    """(sq, skv) keep of the window band: i + off - left <= j <= i + off + right; a side of -1
    is unbounded, or ``unbounded`` (left, right) where TE substitutes a bound (D1)."""
    left, right = window
    if left == -1 and unbounded is not None:
        left = unbounded[0]
    if right == -1 and unbounded is not None:
        right = unbounded[1]
    d = torch.arange(skv).view(1, -1) - torch.arange(sq).view(-1, 1) - offset  # j - i - off
    keep = torch.ones(sq, skv, dtype=torch.bool)
    if left != -1:
        keep &= d >= -left
    if right != -1:
        keep &= d <= right
    return keep


@dataclass
class _Call:
    """What TE's unfused backend gets for one case: padded sizes, real positions, user mask."""

    b: int
    sq: int
    skv: int
    real_q: torch.Tensor  # (b, sq) bool
    real_kv: torch.Tensor  # (b, skv) bool
    nonzero_v: torch.Tensor  # (b, skv): keys whose V is not zero-filled by TE (thd padding)
    visible_q: torch.Tensor  # (b, sq): query rows the output has (thd: real ones only)
    user: torch.Tensor | None  # arbitrary mask (b|1, h|1, sq, skv), True = masked
    from_mask: bool  # padding given as attention_mask (not cu_seqlens)
    pair_in_self: bool  # a (q, kv) mask pair that differs, in self attention (TE takes one)
    user_given: bool  # an attention_mask with a non-padding, non-arbitrary type (D5)


def _lengths_from_cu(cu) -> list[int]:
    cu = [int(c) for c in cu]
    return [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]


def _positions(case: AttnCase, lengths, kw: dict) -> _Call:
    b, sq, skv = case.b, case.sq, case.skv + case.kv_cache_extra
    thd = case.layout_info.q_format == "thd"
    padded = case.mask_type.startswith("padding") or thd
    mask = kw.get("attention_mask")
    i, j = torch.arange(sq).view(1, -1), torch.arange(skv).view(1, -1)
    real_q = torch.ones(b, sq, dtype=torch.bool)
    real_kv = torch.ones(b, skv, dtype=torch.bool)
    from_mask = pair_in_self = False
    if padded and case.mask_type != "arbitrary" and mask is not None:
        from_mask = True
        mq, mkv = (mask, mask) if torch.is_tensor(mask) else mask
        real_q, real_kv = ~mq.reshape(b, sq).cpu(), ~mkv.reshape(b, skv).cpu()
        pair_in_self = case.attention_type == "self" and not torch.equal(real_q, real_kv)
    elif padded:
        if lengths is None and kw.get("cu_seqlens_q") is not None:
            cu_kv = kw.get("cu_seqlens_kv", kw["cu_seqlens_q"])
            lengths = (_lengths_from_cu(kw["cu_seqlens_q"]), _lengths_from_cu(cu_kv))
        if lengths is not None:
            lq = torch.tensor(list(lengths[0])).view(-1, 1)
            lkv = torch.tensor(list(lengths[1])).view(-1, 1)
            real_q, real_kv = (i < lq).expand(b, sq), (j < lkv).expand(b, skv)
    user = None
    if case.mask_type == "arbitrary" and mask is not None:
        user = mask.cpu().bool()
    nonzero_v = real_kv.clone() if case.layout_info.kv_format == "thd" else torch.ones_like(
        real_kv
    )
    visible_q = real_q.clone() if thd else torch.ones_like(real_q)
    user_given = mask is not None and not padded and case.mask_type != "arbitrary"
    return _Call(b, sq, skv, real_q, real_kv, nonzero_v, visible_q, user, from_mask, pair_in_self,
                 user_given)  # fmt: skip


def _left_padded_if_expected(case: AttnCase, call: _Call, window, lengths, grid) -> _Call:
    """Lengths without masks are read as right padding; where the documented grid keeps a
    position right padding would mask, the caller's padding is on the left (the same counts at
    the end of each row and column): read it so, as a mask pair would give it."""
    if not (grid & ~_grids(case, call, window)[0]).any():
        return call
    b, sq, skv = call.b, call.sq, call.skv
    lq = torch.tensor(list(lengths[0])).view(-1, 1)
    lkv = torch.tensor(list(lengths[1])).view(-1, 1)
    mq = torch.arange(sq).view(1, -1) < sq - lq  # True = padding, at the start
    mkv = torch.arange(skv).view(1, -1) < skv - lkv
    pair = (mq.view(b, 1, 1, sq), mkv.view(b, 1, 1, skv))
    left = _positions(case, None, {"attention_mask": pair})
    return left if not (grid & ~_grids(case, left, window)[0]).any() else call


def _grids(case: AttnCase, call: _Call, window, readings=(), te=False, fallback=False):
    """(keep (b, h, sq, skv), uniform rows (b, h, sq), ALiBi offsets (b,)) of the softmax, as
    documented (te=False) or as TE's unfused backend builds it with the given readings."""
    b, sq, skv, h = call.b, call.sq, call.skv, case.h
    br = te_bottom_right(case.mask_type, case.bottom_right_diagonal)
    real_q, real_kv = call.real_q, call.real_kv
    padding = case.mask_type.startswith("padding") or case.layout_info.q_format == "thd"
    self_reads_q = not call.from_mask or call.pair_in_self
    if "D2" in readings and padding and case.attention_type == "self" and self_reads_q:
        real_kv = real_q[:, :skv] if sq == skv else real_kv  # the query mask for both
    lq, lkv = real_q.sum(1), real_kv.sum(1)
    if "D3" in readings and padding:
        m = real_q[:, :, None] & real_kv[:, None, :]
        lq, lkv = m[:, :, 0].sum(1), m[:, 0, :].sum(1)
    final = te_final_mask_type(case, window) if te else case.mask_type
    unbounded = (skv, sq) if "D1" in readings else None
    keep = torch.zeros(b, 1, sq, skv, dtype=torch.bool)
    offsets = torch.zeros(b, dtype=torch.long)
    for x in range(b):
        off = int(lkv[x] - lq[x]) if br and padding else (skv - sq if br else 0)
        keep[x, 0] = _band(sq, skv, window, off, unbounded)
        alibi_off = off
        if te and "D6" in readings and "padding" not in final and padding:
            alibi_off = skv - sq if br else 0
        offsets[x] = alibi_off
        keep[x, 0] &= real_q[x].view(-1, 1) & real_kv[x].view(1, -1)
    if te and final == "no_mask":  # the softmax takes no mask (softmax.py:377-379)
        keep = torch.ones_like(keep)
    keep = keep.expand(b, h, sq, skv)
    if call.user is not None:
        keep = keep & ~call.user.expand(b, h, sq, skv)
    empty = ~keep.any(-1)  # (b, h, sq)
    uniform = torch.zeros_like(empty)
    if te and fallback and case.softmax_type == "vanilla" and "padding" not in final:
        uniform = empty  # -10000 everywhere: torch.softmax makes the row uniform
    return keep, uniform, offsets


def _rows_differ(case, call: _Call, doc, te) -> bool:
    """Whether TE's softmax rows change the output the suites compare (module docstring)."""
    keep_d, _, off_d = doc
    keep_t, uniform_t, off_t = te
    nz = call.nonzero_v[:, None, None, :]  # (b, 1, 1, skv)
    vis = call.visible_q[:, None, :]  # (b, 1, sq)
    keep_t = keep_t | uniform_t[..., None]
    dn, tn = keep_d & nz, keep_t & nz
    tz = keep_t & ~nz
    differ = (dn != tn).any(-1) | ((tz.any(-1)) & tn.any(-1))
    if case.bias_type == "alibi" and bool((off_d != off_t).any()):
        i = torch.arange(call.sq).view(1, 1, -1, 1)
        j = torch.arange(call.skv).view(1, 1, 1, -1)
        shift = (i - j + off_t.view(-1, 1, 1, 1)).abs() - (i - j + off_d.view(-1, 1, 1, 1)).abs()
        shift = shift.expand_as(dn).to(torch.float64)
        kept = dn & (dn == tn)
        hi = torch.where(kept, shift, torch.full_like(shift, -1e9)).amax(-1)
        lo = torch.where(kept, shift, torch.full_like(shift, 1e9)).amin(-1)
        differ |= kept.any(-1) & (hi != lo)
    return bool((differ & vis).any())


def _max_logit_differs(case, doc, te) -> bool:
    """return_max_logit: a head with no kept position at all is -10000 in TE, -inf documented."""
    if not case.return_max_logit:
        return False
    keep_d = doc[0]
    return bool((~keep_d.any(dim=(0, 2, 3))).any())


def explain(
    case: AttnCase, lengths=None, expected=None, call_kwargs=None, fallback_softmax=True
) -> tuple[Deviation, ...]:
    """The deviations that make TE's result for ``case`` differ from the documented one (empty
    when it should agree). ``lengths``: ([lq], [lkv]) per batch element where padding applies;
    ``expected``: the documented grids ([batch][head] -> rows of '1'/'.'), used as the
    documented side when given; ``call_kwargs``: the forward keyword arguments of the call
    (attention_mask, cu_seqlens: needed for left padding, D3, and for D5);
    ``fallback_softmax``: whether TE's softmax takes its torch fallback for the case."""
    kw = dict(call_kwargs or {})
    window = te_window(case.mask_type, case.window)
    if window is None:
        return ()  # TE asserts (and te_ref refuses): an argument error, not a computation
    call = _positions(case, lengths, kw)
    grid = None
    if expected is not None:
        grid = torch.tensor(
            [[[[c == "1" for c in row] for row in rows] for rows in heads] for heads in expected]
        ).expand(case.b, case.h, call.sq, call.skv)
        if lengths is not None and "attention_mask" not in kw and case.mask_type != "arbitrary":
            call = _left_padded_if_expected(case, call, window, lengths, grid)
    found: list[Deviation] = []
    if call.user_given and ("causal" in case.mask_type or te_final_mask_type(case) == "arbitrary"):
        found.append(D5)  # te_ref refuses the mask; TE applies it
    if case.return_max_logit and case.dtype in ("fp16", "bf16") and expected is None:
        found.append(M1)  # max_logit in O's dtype, not fp32 (the grids do not judge max_logit)
    doc = _grids(case, call, window)
    if grid is not None:
        if call.user is None:  # what the documented grid masks beyond the model: the user's mask
            call.user = doc[0] & ~grid
        doc = (grid, doc[1], doc[2])
    readings = ("D1", "D2", "D3", "D6")
    full = _grids(case, call, window, readings, te=True, fallback=fallback_softmax)
    shows = _rows_differ(case, call, doc, full)
    fallback_shows = fallback_softmax and case.softmax_type == "vanilla" and (
        _max_logit_differs(case, doc, full)
    )
    if not (shows or fallback_shows):
        return tuple(found)
    for reading in readings:
        alone = _grids(case, call, window, (reading,), te=True)
        if _rows_differ(case, call, doc, alone):
            found.append(DEVIATIONS[reading])
    fb = _grids(case, call, window, (), te=True, fallback=fallback_softmax)
    if (fallback_softmax and _rows_differ(case, call, doc, fb)) or fallback_shows:
        found.append(FALLBACK)
    # nothing found alone: the model cannot say which (never seen); the failure stays unexplained
    return tuple(dict.fromkeys(found))


def reason(deviations) -> str:
    """One xfail reason for a case's deviations."""
    return "; ".join(str(d) for d in deviations)


# ----------------------------------------------------------------------------- the reproducers


def _fmt(p: torch.Tensor) -> str:
    return "\n".join("  [" + ", ".join(f"{float(x):.3f}" for x in row) + "]" for row in p)


def reproduce(dev_id: str) -> str:
    """Run one reproducer: TE's probability grid (batch 0, head 0) and the documented one."""
    import te_ref
    from te_conformance.suites.adapters import te_loader
    from te_conformance.suites.adapters.te_cpu_standin import cpu_redirect

    te, missing = te_loader.load()
    if missing:
        raise SystemExit(missing)
    dev = DEVIATIONS[dev_id]
    r = dev.reproducer
    if r.get("max_logit_dtype"):
        return _max_logit_dtype(te, te_loader, dev)
    sq, skv, mask_type = r["sq"], r["skv"], r["mask"]
    lq, lkv = r.get("lq", (sq,)), r.get("lkv", (skv,))
    b = len(lq)
    thd = r.get("thd", False)
    cross = r.get("cross", sq != skv)
    region = cpu_redirect if te_loader.stand_in() else _nothing
    device = "cpu" if te_loader.stand_in() else "cuda"

    def inputs(lq, lkv):
        q = torch.zeros(b, sq, 1, 4, dtype=torch.float64, device=device)
        k = torch.randn(b, skv, 1, 4, generator=torch.Generator().manual_seed(0),
                        dtype=torch.float64).to(device)  # fmt: skip
        v = torch.eye(skv, dtype=torch.float64, device=device).view(1, skv, 1, skv)
        v = v.expand(b, skv, 1, skv).contiguous()
        kw: dict = {"attn_mask_type": mask_type}
        cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
        cu_kv = torch.tensor([0, *torch.tensor(lkv).cumsum(0).tolist()], dtype=torch.int32)
        if thd:
            q = torch.cat([q[x, : lq[x]] for x in range(b)])
            k = torch.cat([k[x, : lkv[x]] for x in range(b)])
            v = torch.cat([v[x, : lkv[x]] for x in range(b)])
            kw.update(cu_seqlens_q=cu_q.to(device), cu_seqlens_kv=cu_kv.to(device),
                      max_seqlen_q=sq, max_seqlen_kv=skv)  # fmt: skip
        elif r.get("left"):
            mq = torch.arange(sq).view(1, -1) < (sq - torch.tensor(lq)).view(-1, 1)
            mkv = torch.arange(skv).view(1, -1) < (skv - torch.tensor(lkv)).view(-1, 1)
            kw["attention_mask"] = (mq.view(b, 1, 1, sq).to(device),
                                    mkv.view(b, 1, 1, skv).to(device))  # fmt: skip
        elif mask_type.startswith("padding"):
            kw.update(cu_seqlens_q=cu_q.to(device), cu_seqlens_kv=cu_kv.to(device))
        if r.get("alibi"):
            kw["core_attention_bias_type"] = "alibi"
        if r.get("window"):
            kw["window_size"] = r["window"]
        return q, k, v, kw

    fmt = "thd" if thd else "bshd"
    with region():
        module = te.DotProductAttention(
            1, (4, skv), qkv_format=fmt, attn_mask_type=mask_type,
            attention_type="cross" if cross else "self", softmax_scale=1.0,
        )  # fmt: skip
    lines = [f"{dev.id}: {dev.title}", f"[TE {TE_RELEASE} {dev.te_lines}]", ""]
    if "first" in r:  # D4: a first call on the same module with other lengths fills the cache
        q, k, v, kw = inputs(*r["first"])
        te_loader.reset_alibi_cache(module)
        with region():
            module(q, k, v, qkv_format=fmt, **kw)
    else:
        te_loader.reset_alibi_cache(module)
    q, k, v, kw = inputs(lq, lkv)
    te_kw = dict(kw)
    if r.get("user_column0"):
        m = torch.zeros(b, 1, sq, skv, dtype=torch.bool, device=device)
        m[..., 0] = True
        te_kw["attention_mask"] = m
    with region():
        out = module(q, k, v, qkv_format=fmt, **te_kw)
    ref = te_ref.dot_product_attention(
        q, k, v, qkv_layout=f"{fmt}_{fmt}_{fmt}", softmax_scale=1.0,
        attention_type="cross" if cross else "self", **kw,
    )  # fmt: skip
    rows = lq[0] if thd else sq
    lines.append(f"TE {TE_RELEASE} (batch 0, head 0):")
    lines.append(_fmt(out.detach().view(-1, skv)[:rows] if thd else out.detach()[0]))
    lines.append("documented (te_ref, SPEC):")
    lines.append(_fmt(ref.view(-1, skv)[:rows] if thd else ref[0]))
    if dev is FALLBACK:
        lines.append(_fallback_max_logit(te, region, device))
    return "\n".join(lines)


def _max_logit_dtype(te, loader, dev) -> str:
    """M1: the dtype of TE's max_logit for bf16 inputs."""
    from te_conformance.suites.adapters.te_cpu_standin import cpu_redirect

    region = cpu_redirect if loader.stand_in() else _nothing
    device = "cpu" if loader.stand_in() else "cuda"
    q = torch.randn(1, 3, 1, 4, device=device).to(torch.bfloat16)
    with region():
        module = te.DotProductAttention(1, 4, qkv_format="bshd", attn_mask_type="causal",
                                        return_max_logit=True)  # fmt: skip
        _, max_logit = module(q, q, q)
    return (
        f"{dev.id}: {dev.title}\n[TE {TE_RELEASE} {dev.te_lines}]\n\n"
        f"TE {TE_RELEASE}: max_logit {max_logit.dtype} {tuple(max_logit.shape)}; "
        "documented (SPEC §1): torch.float32 [h]"
    )


def _fallback_max_logit(te, region, device) -> str:
    q = torch.randn(1, 2, 1, 4, dtype=torch.float64, device=device)
    m = torch.ones(1, 1, 2, 2, dtype=torch.bool, device=device)
    with region():
        module = te.DotProductAttention(1, 4, qkv_format="bshd", attn_mask_type="arbitrary",
                                        return_max_logit=True)  # fmt: skip
        _, max_logit = module(q, q, q, attention_mask=m)
    return f"\nmax_logit of a head with every position masked: TE {max_logit.tolist()}, " + (
        "documented -inf"
    )


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv: list[str]) -> int:
    ids = argv or list(DEVIATIONS)
    for dev_id in ids:
        if dev_id not in DEVIATIONS:
            print(f"unknown deviation {dev_id!r}; known: {', '.join(DEVIATIONS)}")
            return 2
        print(reproduce(dev_id))
        print()
    return 0


if __name__ == "__main__":
    torch.set_printoptions(precision=3, sci_mode=False)
    raise SystemExit(main(sys.argv[1:]))
