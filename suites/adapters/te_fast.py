"""`--impl te_fast` (the default): te_fast.UnfusedDotProductAttention, eager."""

from __future__ import annotations

import torch

from te_conformance.suites.adapters.base import FP8_ROLES, Adapter, FP8RoleState, Support


class TeFast(Adapter):
    """te_fast.UnfusedDotProductAttention, eager."""

    name = "te_fast"
    # everything the standard has; exact one-key rows on every device (its softmax kernels form
    # exp(0) over a sum of 1)
    support = Support(
        capabilities=("dropout", "dropout_ctx", "validates_arguments", "reference_messages",
                      "traceable", "capturable", "sync_free", "deterministic", "exact_one_key",
                      "fp8", "fp8_state"),
        capability_devices={},
    )  # fmt: skip
    default = True

    def unavailable_reason(self, device):
        import te_fast

        return te_fast.device_unavailable_reason(device)

    def build(self, case, scale, dropout=0.0, dropout_ctx=None):
        import contextlib

        from te_fast import UnfusedDotProductAttention

        return UnfusedDotProductAttention(
            scale,
            attention_type=case.attention_type,
            attention_dropout=dropout,
            attention_dropout_ctx=dropout_ctx or contextlib.nullcontext,
            softmax_type=case.softmax_type,
            return_max_logit=case.return_max_logit,
            num_attention_heads=case.h if case.offset_via == "param" else None,
        ).to(case.device)

    def fp8_recipe(self, recipe):
        """te_fast.fp8's recipe with the suite recipe's fields, one by one."""
        from te_fast.fp8 import CurrentScaling, DelayedScaling, Format

        fmt = Format(recipe.fp8_format)
        if hasattr(recipe, "amax_history_len"):
            return DelayedScaling(fmt, margin=recipe.margin,
                                  amax_history_len=recipe.amax_history_len,
                                  amax_compute_algo=recipe.amax_compute_algo)  # fmt: skip
        return CurrentScaling(fmt)

    def read_fp8_state(self, module):
        """The module's ``fp8_state`` (te_fast.fp8.ScalingStateView per role)."""
        views = module.fp8_state
        return {
            role: FP8RoleState(views[role].amax_history, views[role].last_scale, views[role].scale)
            for role in FP8_ROLES
        }

    def call(self, module, case, q, k, v, kwargs):
        stand_in = {}
        if case.softmax_type == "learnable" and case.offset_via == "param":
            # the module owns the offset: load the case's values into its parameter
            kwargs = dict(kwargs)
            offset = kwargs.pop("softmax_offset")
            with torch.no_grad():
                module.softmax_offset.copy_(offset)
            stand_in["offset"] = module.softmax_offset
        out, max_logit, _ = super().call(module, case, q, k, v, kwargs)
        return out, max_logit, stand_in
