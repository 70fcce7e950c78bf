"""Property-based contract fuzzing (hypothesis): every te_fast op, and the attention module of
every selected adapter (--impl; te_fast by default), on drawn inputs. Per example: no output
aliases an input, no input byte changes, the fake matches the real output (ops), the numerics
equal te_ref's under SPEC §6, each example's one draw judged on its own by the function the
deterministic suites use (suites/fuzz/checks.py has the checks, suites/fuzz/strategies.py what
is drawn; profiles: pytest --hypothesis-profile ci|gpu|explore). The draws are seeded from the
test's id and do not depend on what else was imported.

A failure prints hypothesis' shrunk "Falsifying example" and a ready-to-paste reproducer line.
"""

from __future__ import annotations

import pytest

from reports import record
from suites import devices
from suites.plugin import suite_nodeid

pytest.importorskip(
    "hypothesis",
    reason="hypothesis is not installed (pip install -e '.[test]'; on a machine without a "
    "registry carry its wheels for that machine's Python, e.g. python -m pip download hypothesis "
    "sortedcontainers --no-deps --only-binary=:all: --python-version 3.12 --platform "
    "manylinux2014_x86_64 -d .whl, which tools/gpu_run.sh installs)",
)

from suites.fuzz import checks as fc  # noqa: E402
from suites.fuzz import strategies as fs  # noqa: E402
from suites.op_cases import SOFTMAX_OPS  # noqa: E402

DEVICES = devices.device_params()




def _record(what: str, device_name: str, kind: str, impl: str = "te_fast") -> int:
    n = fs.examples(device_name, kind)
    record.case(impl=impl, layout=f"fuzz:{what}", device=device_name,
                mask_type=f"{fs.profile_name()}:{n}")  # fmt: skip
    return n


@pytest.fixture
def fuzz_key(request) -> str:
    """The test's id, as the checkout names it: the seed of its draws."""
    return suite_nodeid(request.node)


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("op", list(SOFTMAX_OPS))
def test_fuzz_softmax(op, device_name, fuzz_key):
    """The forward op and its backward on drawn shapes, layouts, scales, masks and -inf."""
    n = _record(op, device_name, "softmax")
    devices.require(device_name)
    fs.fuzz(fc.check_softmax_example, fs.softmax_examples(op, device_name), device_name, n,
            explicit=fs.softmax_explicit(op), key=fuzz_key)  # fmt: skip


@pytest.mark.parametrize("device_name", DEVICES)
@pytest.mark.parametrize("direction", ["thd_to_bshd", "bshd_to_thd"])
def test_fuzz_convert(direction, device_name, monkeypatch, fuzz_key):
    """THD<->BSHD on drawn ragged batches, dtypes and layouts; half the examples break one
    cu_seqlens/length rule: an error on CPU, NaN-poisoned rows on CUDA (no debug checks)."""
    n = _record(f"convert_{direction}", device_name, "convert")
    devices.require(device_name)
    monkeypatch.delenv("TE_FAST_DEBUG_CHECKS", raising=False)
    fs.fuzz(fc.check_convert_example, fs.convert_examples(direction), device_name, n,
            explicit=fs.convert_explicit(direction), key=fuzz_key)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["thd_to_bshd", "bshd_to_thd"])
def test_fuzz_convert_debug_checks(direction, monkeypatch, fuzz_key):
    """CUDA with TE_FAST_DEBUG_CHECKS=1: bad cu_seqlens raise, naming the op and the argument."""
    n = _record(f"convert_{direction}_debug", "cuda", "convert")
    devices.require("cuda")
    monkeypatch.setenv("TE_FAST_DEBUG_CHECKS", "1")
    fs.fuzz(fc.check_convert_example, fs.convert_examples(direction), "cuda", n,
            explicit=fs.convert_explicit(direction), key=fuzz_key)  # fmt: skip


@pytest.mark.per_adapter(family=list(fs.FAMILIES), device_name=DEVICES)
def test_fuzz_module(adapter, family, device_name, fuzz_key):
    """The adapter's attention module (te_fast's UnfusedDotProductAttention by default) against
    te_ref over drawn layouts of the family, mask types, windows, biases, softmax types, GQA
    groups and ragged lengths, as far as the adapter declares them; no alias, inputs unchanged."""
    n = _record(f"module_{family}", device_name, "module", impl=adapter.name)
    devices.require(device_name, needs_te_fast=adapter.name == "te_fast")
    reason = adapter.unavailable_reason(device_name)
    if reason:
        pytest.skip(reason)
    if not fs.supported_layouts(family, adapter):
        pytest.skip(f"{adapter.name} supports no layout of the {family} family")
    if not [t for t in fs.MODULE_DTYPES[device_name] if t in adapter.dtypes]:
        pytest.skip(f"{adapter.name} supports none of the fuzz's {device_name} dtypes")
    fs.fuzz(fc.check_module_example, fs.module_examples(family, device_name, adapter),
            device_name, n, explicit=fs.module_explicit(family, device_name, adapter), key=fuzz_key,
            adapter=adapter)  # fmt: skip
