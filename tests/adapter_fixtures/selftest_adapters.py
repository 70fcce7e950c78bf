"""Broken and dishonest adapters, registered as a pytest plugin (`-p selftest_adapters`), that the
capability tests must catch; tests/test_adapters.py runs the suites on them in a child pytest."""

from suites import adapters as impls


class IgnoresDropout(impls.TeFast):
    """Declares dropout but never applies it."""

    name = "selftest.ignores_dropout"

    def build(self, case, scale, dropout=0.0):
        return super().build(case, scale, 0.0)


class FixedDropout(impls.TeFast):
    """Applies dropout 0.3 whatever it is asked for (also at p = 0)."""

    name = "selftest.fixed_dropout"

    def build(self, case, scale, dropout=0.0):
        return super().build(case, scale, 0.3)


class ClaimsValidation(impls.TorchSdpa):
    """torch.sdpa claiming TE's argument checks, which it does not have."""

    name = "selftest.claims_validation"
    validates_arguments = True


class Uncapturable(impls.TeFast):
    """te_fast declared without CUDA-graph capture: its reduce-overhead cases must skip."""

    name = "selftest.uncapturable"
    capturable = False
    why_not = {"capturable": "declared so by the selftest"}


for adapter in (IgnoresDropout(), FixedDropout(), ClaimsValidation(), Uncapturable()):
    impls.ADAPTERS[adapter.name] = adapter
