"""te_ref, the judge, as an adapter: te_ref.dot_product_attention in float64 (the golden answer)
or in the input dtype (the same-precision composite whose rounding sets SPEC §6's bound), and
te_ref.fp8's emulation with a fresh scaling state per module. The suites' one way of running
te_ref: the references of every case (suites/checks/attention.py), the literal pins
(suites/checks/literal_values.py) and te_ref's own checks against the literals
(suites/judge/). Not in the --impl registry: the judge judged by itself proves nothing."""

from __future__ import annotations

import torch

import te_ref
import te_ref.fp8 as ref8
from te_conformance.suites.adapters.base import Adapter, Support
from te_conformance.suites.cases import DTYPES, AttnCase

COMPUTES = ("float64", "same_precision")


class TeRef(Adapter):
    """te_ref in float64 (``compute="float64"``) or in the case's dtype (``"same_precision"``).
    Its module returns (out, max_logit) when the case asks for max_logit; ``fp8=True`` runs
    te_ref.fp8's emulation (float64: its exact path; same precision: its rounded output)."""

    name = "te_ref"
    # te_ref.fp8's emulation: the mask table's FP8 variant runs through it
    support = Support(capabilities=(*Support().capabilities, "fp8"))
    default = False

    def __init__(self, compute: str = "float64"):
        if compute not in COMPUTES:
            raise ValueError(f"TeRef: compute must be one of {COMPUTES}, got {compute!r}")
        self.compute = compute

    def compute_dtype(self, case: AttnCase) -> torch.dtype:
        return torch.float64 if self.compute == "float64" else DTYPES[case.dtype]

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        if dropout or dropout_ctx is not None:
            raise NotImplementedError("te_ref runs no dropout (the suites judge dropout by its "
                                      "statistics, not against a reference)")  # fmt: skip
        return _Reference(case, scale, self.compute_dtype(case))


class _Reference(torch.nn.Module):
    def __init__(self, case: AttnCase, scale, compute: torch.dtype):
        super().__init__()
        self.case, self.scale, self.compute = case, scale, compute

    def forward(self, q, k, v, fp8=False, fp8_meta=None, **kwargs):
        case = self.case
        if fp8:  # a fresh scaling state, as a fresh module has
            state = ref8.FP8State(fp8_meta["recipe"], q.device)
            run = ref8.fp8_dot_product_attention(
                q, k, v, None, softmax_scale=self.scale, fp8_state=state,
                attention_type=case.attention_type, **kwargs,
            )  # fmt: skip
            return run.out if self.compute == torch.float64 else run.out_lp
        return te_ref.dot_product_attention(
            q, k, v, softmax_scale=self.scale, softmax_type=case.softmax_type,
            attention_type=case.attention_type, return_max_logit=case.return_max_logit,
            compute_dtype=self.compute, **kwargs,
        )  # fmt: skip
