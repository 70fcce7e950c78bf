"""FP8 cases as data: the three literal passes of TE's delayed and current scaling, typed by hand
from TE's formulas (suites/conformance/test_fp8.py judges an adapter's scaling state on them,
suites/judge/test_te_ref.py te_ref's)."""

from __future__ import annotations

import torch

import te_ref.fp8 as ref8
from te_conformance.suites.cases import AttnCase, sized

# Three passes (forward and backward) of a one-head, two-token, d = 1 causal call in bf16 with
# softmax_scale 1, whose every amax is known by hand: q = 0, k = (a/2, 0), v = (a, 0) and
# dO = (0, g), with a = 2, 8, 4 and g = 4, 2, 1 over the passes. Then:
#   S = [[1, 0], [1/2, 1/2]]                amax 1 (every quantization of it below is exact)
#   O = (v8, v8 / 2)                        amax v8 (v8, k8: v[0], k[0] after the QKV quantization,
#                                           where a value times the scale saturates at 448)
#   dP = [[0, 0], [d, -d]], d = g * v8 / 4  amax d (d8: d after the dP quantization)
#   dQ = (0, d8 * k8), dK = 0, dV = (g/2, g/2)   amax max(d8 * k8, g/2)
# Each role's tuple: (amax, the scale it quantized with, its scale after the pass) per pass.
# Formats HYBRID: E4M3 (max 448) forward, E5M2 (max 57344) backward.
#
# DelayedScaling(margin=1, amax_history_len=2): scale = max / amax_h / 2, amax_h the larger of
# the last two amaxes ("max") or the last ("most_recent"); the first pass quantizes with 1.
#   QKV: scales 1, 448/2/2 = 112, 448/8/2 = 28 -> v8 = 2, min(8*112, 448)/112 = 4, 4 and
#        k8 = 1, 4*112/112 = 4, 2; after pass 3: max(4, 8) -> 28, most_recent 4 -> 56
#   O:   amax v8 = 2, 4, 4 -> 448/2/2 = 112, then 448/4/2 = 56
#   dO:  amax 4, 2, 1 -> 57344/4/2 = 7168; then max(2, 4) -> 7168 | 2 -> 14336; then
#        max(1, 2) -> 14336 | 1 -> 28672 (every g * scale is on the E5M2 grid: dO8 = g)
#   dP:  d = 4*2/4 = 2, 2*4/4 = 2, 1*4/4 = 1 -> 14336, 14336, then 14336 | 28672
#   dQKV: max(2*1, 2) = 2, max(2*4, 1) = 8, max(1*2, 1/2) = 2 -> 14336, 57344/8/2 = 3584,
#        then max(2, 8) -> 3584 | 2 -> 14336
# CurrentScaling: QKV, O, dO, dQKV scale = max / amax of the tensor itself; S and dP delayed
# with a one-entry most_recent history and no margin.
#   QKV: 448/2, 448/8, 448/4 = 224, 56, 112 -> v8 = a, k8 = a/2 (a * scale = 448 exactly)
#   S:   1, then 448/1 = 448
#   O:   amax v8 = 2, 8, 4
#   dP:  d = 4*2/4 = 2, 2*8/4 = 4, 1*4/4 = 1; pass 2 quantizes 4 with 57344/2 = 28672:
#        4 * 28672 saturates at 57344, d8 = 2; pass 3 scale 57344/4 = 14336
#   dQKV: max(2*1, 2) = 2, max(2*4, 1) = 8, max(1*2, 1/2) = 2
THREE_PASSES = {
    "max": {
        "QKV": ((2, 8, 4), (1, 112, 28), (112, 28, 28)),
        "S": ((1, 1, 1), (1, 224, 224), (224, 224, 224)),
        "O": ((2, 4, 4), (1, 112, 56), (112, 56, 56)),
        "dO": ((4, 2, 1), (1, 7168, 7168), (7168, 7168, 14336)),
        "dP": ((2, 2, 1), (1, 14336, 14336), (14336, 14336, 14336)),
        "dQKV": ((2, 8, 2), (1, 14336, 3584), (14336, 3584, 3584)),
    },
    "most_recent": {
        "QKV": ((2, 8, 4), (1, 112, 28), (112, 28, 56)),
        "S": ((1, 1, 1), (1, 224, 224), (224, 224, 224)),
        "O": ((2, 4, 4), (1, 112, 56), (112, 56, 56)),
        "dO": ((4, 2, 1), (1, 7168, 14336), (7168, 14336, 28672)),
        "dP": ((2, 2, 1), (1, 14336, 14336), (14336, 14336, 28672)),
        "dQKV": ((2, 8, 2), (1, 14336, 3584), (14336, 3584, 14336)),
    },
    "current": {
        "QKV": ((2, 8, 4), (224, 56, 112), (224, 56, 112)),
        "S": ((1, 1, 1), (1, 448, 448), (448, 448, 448)),
        "O": ((2, 8, 4), (224, 56, 112), (224, 56, 112)),
        "dO": ((4, 2, 1), (14336, 28672, 57344), (14336, 28672, 57344)),
        "dP": ((2, 4, 1), (1, 28672, 14336), (28672, 14336, 57344)),
        "dQKV": ((2, 8, 2), (28672, 7168, 28672), (28672, 7168, 28672)),
    },
}


THREE_PASS_RECIPES = {
    "max": ref8.DelayedScaling(margin=1, fp8_format="HYBRID", amax_history_len=2,
                               amax_compute_algo="max"),
    "most_recent": ref8.DelayedScaling(margin=1, fp8_format="HYBRID", amax_history_len=2,
                                       amax_compute_algo="most_recent"),
    "current": ref8.CurrentScaling(fp8_format="HYBRID"),
}  # fmt: skip


THREE_PASS_KWARGS = dict(qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")


def three_pass_case(device_name):
    return AttnCase("bshd_bshd_bshd", "bf16", "causal", device=device_name, b=1, sq=2, skv=2,
                    h=1, hg=1, d=1, dv=1)  # fmt: skip


def three_pass_inputs(a: float, g: float, device):
    def column(x0, x1):
        return torch.tensor([x0, x1], dtype=torch.bfloat16, device=device)

    q = column(0.0, 0.0).reshape(1, 2, 1, 1)
    k = column(a / 2, 0.0).reshape(1, 2, 1, 1)
    v = column(a, 0.0).reshape(1, 2, 1, 1)
    return q, k, v, column(0.0, g).reshape(1, 2, 1)


THREE_PASS_VALUES = ((2.0, 4.0), (8.0, 2.0), (4.0, 1.0))  # (a, g) of each pass


def fp8_case(layout, dtype, device_name, gqa=1):
    mask = "padding_causal" if layout.startswith("thd") else "causal"
    return sized(AttnCase(layout, dtype, mask, device=device_name), gqa=gqa)
