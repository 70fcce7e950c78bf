"""Broken and dishonest adapters, registered as a pytest plugin (`-p selftest_adapters`), that the
capability tests must catch; tests/test_adapters.py runs the suites on them in a child pytest."""

from dataclasses import replace

from te_conformance.suites import adapters as impls
from te_conformance.suites.adapters.te_fast import TeFast
from te_conformance.suites.adapters.torch_sdpa import TorchSdpa


class IgnoresDropout(TeFast):
    """Declares dropout but never applies it."""

    name = "selftest.ignores_dropout"

    def build(self, case, scale, dropout=0.0):
        return super().build(case, scale, 0.0)


class FixedDropout(TeFast):
    """Applies dropout 0.3 whatever it is asked for (also at p = 0)."""

    name = "selftest.fixed_dropout"

    def build(self, case, scale, dropout=0.0):
        return super().build(case, scale, 0.3)


class ClaimsValidation(TorchSdpa):
    """torch.sdpa claiming TE's argument checks, which it does not have."""

    name = "selftest.claims_validation"
    support = replace(
        TorchSdpa.support,
        capabilities=(*TorchSdpa.support.capabilities, "validates_arguments"),
    )


class Uncapturable(TeFast):
    """te_fast declared without CUDA-graph capture: its reduce-overhead cases must skip."""

    name = "selftest.uncapturable"
    support = replace(
        TeFast.support,
        capabilities=tuple(c for c in TeFast.support.capabilities if c != "capturable"),
        why={"capturable": "declared so by the selftest"},
    )


class Fp8IgnoredNoState(TeFast):
    """Declares FP8 but computes in bf16 whatever it is asked (fp8 dropped), and exposes no
    scaling state: the emulation cases must fail, the state cases skip."""

    name = "selftest.fp8_ignored"
    support = replace(
        TeFast.support,
        capabilities=tuple(c for c in TeFast.support.capabilities if c != "fp8_state"),
        why={"fp8_state": "declared so by the selftest"},
    )

    def call(self, module, case, q, k, v, kwargs):
        kwargs = {n: a for n, a in kwargs.items() if n not in ("fp8", "fp8_meta")}
        return super().call(module, case, q, k, v, kwargs)


class Fp8RecipeMostRecent(TeFast):
    """Translates every DelayedScaling recipe with amax_compute_algo "most_recent" (a recipe
    field dropped in translation): the "max" state cases must fail."""

    name = "selftest.fp8_most_recent"

    def fp8_recipe(self, recipe):
        recipe = super().fp8_recipe(recipe)
        if hasattr(recipe, "amax_compute_algo"):
            recipe = type(recipe)(recipe.fp8_format, recipe.margin, recipe.amax_history_len,
                                  "most_recent")  # fmt: skip
        return recipe


for adapter in (IgnoresDropout(), FixedDropout(), ClaimsValidation(), Uncapturable(),
                Fp8IgnoredNoState(), Fp8RecipeMostRecent()):  # fmt: skip
    impls.ADAPTERS[adapter.name] = adapter
