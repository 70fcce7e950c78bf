"""Property-based contract fuzzing (hypothesis) of the attention module of every selected adapter
(--impl; te_fast by default) on drawn inputs (te_fast's ops: suites/te_fast/test_op_fuzz.py).
Per example: no output aliases an input, no input byte changes, the numerics equal te_ref's
under SPEC §6, each example's one draw judged on its own by the function the
deterministic suites use (suites/fuzz/checks.py has the checks, suites/fuzz/strategies.py what
is drawn; profiles: pytest --hypothesis-profile ci|gpu|explore). The draws are seeded from the
test's id and do not depend on what else was imported.

A failure prints hypothesis' shrunk "Falsifying example" and a ready-to-paste reproducer line.
"""

from __future__ import annotations

import pytest

from te_conformance.suites import devices, skips
from te_conformance.suites.adapters import ready
from te_conformance.suites.fuzz import HYPOTHESIS_MISSING

pytest.importorskip("hypothesis", reason=HYPOTHESIS_MISSING)

from te_conformance.suites.fuzz import checks as fc  # noqa: E402
from te_conformance.suites.fuzz import strategies as fs  # noqa: E402

DEVICES = devices.device_params()
pytestmark = pytest.mark.feature("fuzz")


@pytest.mark.per_adapter(family=list(fs.FAMILIES), device_name=DEVICES)
def test_fuzz_module(adapter, family, device_name, fuzz_key):
    """The adapter's attention module (te_fast's UnfusedDotProductAttention by default) against
    te_ref over drawn layouts of the family, mask types, windows, biases, softmax types, GQA
    groups and ragged lengths, as far as the adapter declares them; no alias, inputs unchanged."""
    n = fs.record_run(f"module_{family}", device_name, "module", impl=adapter.name)
    ready(adapter, None, device=device_name)
    if not fs.supported_layouts(family, adapter):
        skips.skip("declined", [f"{adapter.name} supports no layout of the {family} family"])
    if not [t for t in fs.MODULE_DTYPES[device_name] if t in adapter.support.dtypes]:
        skips.skip("declined", [f"{adapter.name} supports none of the fuzz's {device_name} "
                                "dtypes"])  # fmt: skip
    fs.fuzz(fc.check_module_example, fs.module_examples(family, device_name, adapter),
            device_name, n, explicit=fs.module_explicit(family, device_name, adapter), key=fuzz_key,
            adapter=adapter)  # fmt: skip
