"""Every path of te_fast's UnfusedDotProductAttention inside the verdict.

Calls with at least 64 MiB of scores (fp16/bf16, vanilla softmax, no bias, no max_logit) take
te_fast's chunked eager core (te_fast/_attention_core.py), which no case of
suites/conformance/test_attention.py is large enough to reach. Here the core is judged on the
same case families as the ops path:

- ``test_eager_core``: every module matrix of test_attention.py projected onto what the core
  takes (core_projection), the size threshold lowered to 0 and the scores cut into one slice
  per batch element (masks, lengths and data differ between them);
- ``test_eager_core_heads``: its cases with per-head masks or GQA/MQA, one head a slice;
- ``test_eager_core_at_the_threshold``: one call of exactly 64 MiB of scores at te_fast's own
  settings;

each judged as test_attention.py judges a module case (check_case: SPEC §6 on the output and
every gradient, exact zeros, no alias, no mutation). ``test_every_dispatch_path_has_a_case``
measures, by the module's own dispatch counters (te_fast.attention.DISPATCH_PATHS), that these
cases and test_attention.py's take every path of the module, and fails naming one that none
takes. te_fast only: other adapters have no such paths (``--impl`` does not apply here).
"""

from __future__ import annotations

import collections
import warnings
import zlib
from dataclasses import replace

import pytest
import torch

te_fast = pytest.importorskip("te_fast")
if te_fast.UNAVAILABLE_REASON is not None:
    pytest.skip(f"te_fast unavailable: {te_fast.UNAVAILABLE_REASON}", allow_module_level=True)

from te_conformance.suites import devices  # noqa: E402
from te_conformance.suites.adapters import ADAPTERS  # noqa: E402
from te_conformance.suites.cases import DTYPES, AttnCase, make_inputs  # noqa: E402
from te_conformance.suites.cases import MODULE_MATRICES as MATRICES  # noqa: E402
from te_conformance.suites.checks.attention import check_case, run_impl  # noqa: E402
from te_conformance.suites.checks.one_key import (  # noqa: E402
    ONE_KEY,
    assert_rows_are_value_rows,
    one_key_call,
)
from te_fast import _registry  # noqa: E402
from te_fast.attention import DISPATCH_PATHS, UnfusedDotProductAttention  # noqa: E402

ADAPTER = ADAPTERS["te_fast"]


def core_projection(case: AttnCase) -> AttnCase:
    """The case as te_fast's eager core takes it (UnfusedDotProductAttention._core_plan: fp16 or
    bf16, a vanilla softmax, no bias, no max_logit): fp32 in bf16, bias, sink softmax and
    max_logit taken off; layout, mask, window, alignment, GQA/MQA/MLA, cross attention, padding
    source, ragged lengths and sizes as they were."""
    dtype = "bf16" if case.dtype == "fp32" else case.dtype
    return replace(case, dtype=dtype, bias_type="no_bias", bias_shape=None, alibi_slopes=None,
                   softmax_type="vanilla", offset_via="arg", return_max_logit=False)  # fmt: skip


def eager_core_cases(device: str) -> list[AttnCase]:
    """Every module matrix projected onto the eager core (core_projection), once per case id."""
    cases: dict[str, AttnCase] = {}
    for matrix in MATRICES.values():
        for case in matrix(device):
            core = core_projection(case)
            if not core.invalid_reason():
                cases.setdefault(core.id, core)
    return list(cases.values())


def eager_core_head_cases(device: str) -> list[AttnCase]:
    """The eager-core cases where heads differ in more than their data: per-head (arbitrary)
    masks, and GQA/MQA (query heads sharing a kv head)."""
    return [c for c in eager_core_cases(device) if c.mask_type == "arbitrary" or c.hg != c.h]


# Scores of exactly te_fast's CORE_MIN_SCORE_BYTES (64 MiB, typed from its docstring) in bf16:
# 2 x 4 x 2048 x 2048 elements x 2 bytes = 2^26 bytes. A padded batch (per-batch masks), GQA.
THRESHOLD_BYTES = 64 << 20


def eager_core_threshold_cases(device: str) -> list[AttnCase]:
    case = AttnCase("bshd_bshd_bshd", "bf16", "padding_causal", device=device, b=2, sq=2048,
                    skv=2048, h=4, hg=2, d=16, dv=16, padding_from="mask")  # fmt: skip
    assert case.b * case.h * case.sq * case.skv * 2 == THRESHOLD_BYTES
    return [case]


# name -> (cases of a device, how the core slices them: "batch" (one batch element a slice),
# "heads" (one head a slice), None (te_fast's own settings))
CORE_MATRICES = {
    "eager_core": (eager_core_cases, "batch"),
    "eager_core_heads": (eager_core_head_cases, "heads"),
    "eager_core_threshold": (eager_core_threshold_cases, None),
}
# the dispatch counter each way of slicing must move
SPLIT_PATHS = {"batch": "core:batch_slices", "heads": "core:head_slices", None: "core:one_slice"}


def _params(matrix: str):
    cases = CORE_MATRICES[matrix][0]
    return [
        pytest.param(case, id=case.id, marks=[pytest.mark.gpu] if dev == "cuda" else [])
        for dev in devices.DEVICES
        for case in cases(dev)
    ]


def core_settings(monkeypatch, case: AttnCase, split: str | None) -> collections.Counter:
    """te_fast's module settings for ``case`` as its test here runs it, through monkeypatch:
    for a split, the core's size threshold at 0 and score_chunk_bytes at one batch element's
    scores ("batch") or at 1 byte (one head a slice); None keeps te_fast's own. Returns a fresh
    UnfusedDotProductAttention.dispatch_counts, installed for the test."""
    if split is not None:
        item = DTYPES[case.dtype].itemsize
        element = case.h * case.sq * (case.skv + case.kv_cache_extra) * item  # the call's sq, skv
        chunk = element if split == "batch" else 1
        monkeypatch.setattr(UnfusedDotProductAttention, "core_min_score_bytes", 0)
        monkeypatch.setattr(UnfusedDotProductAttention, "score_chunk_bytes", chunk)
    counts: collections.Counter = collections.Counter()
    monkeypatch.setattr(UnfusedDotProductAttention, "dispatch_counts", counts)
    return counts


def _check_on_the_core(case, matrix, monkeypatch):
    split = CORE_MATRICES[matrix][1]
    counts = core_settings(monkeypatch, case, split)
    check_case(ADAPTER, case)
    ops = {p: n for p, n in counts.items() if p.startswith("ops:")}
    assert counts[SPLIT_PATHS[split]] == 1 and not ops, (
        f"expected one forward down {SPLIT_PATHS[split]}, got {dict(counts)}"
    )


@pytest.mark.parametrize("case", _params("eager_core"))
def test_eager_core(case, monkeypatch, one_thread):
    """The chunked eager core on every module case it takes, one batch element a slice."""
    _check_on_the_core(case, "eager_core", monkeypatch)


@pytest.mark.parametrize("case", _params("eager_core_heads"))
def test_eager_core_heads(case, monkeypatch, one_thread):
    """The eager core one head a slice, on its cases with per-head masks or GQA/MQA."""
    _check_on_the_core(case, "eager_core_heads", monkeypatch)


@pytest.mark.parametrize("case", _params("eager_core_threshold"))
def test_eager_core_at_the_threshold(case, monkeypatch, one_thread):
    """A call of exactly 64 MiB of scores at te_fast's own settings takes the eager core (one
    slice: the default slice is 256 MiB). CPU: ~1.7 GiB resident, ~5 s on one thread."""
    _check_on_the_core(case, "eager_core_threshold", monkeypatch)


# Paths that no case here or in test_attention.py takes, and the suite whose every case does.
DISPATCH_ELSEWHERE = {"fp8": "suites/conformance/test_fp8.py (fp8=True)"}


@pytest.mark.parametrize("device_name", devices.device_params())
def test_every_dispatch_path_has_a_case(device_name, monkeypatch, one_thread):
    """Every way UnfusedDotProductAttention's forward can go (DISPATCH_PATHS) is taken by a case
    of test_attention.py's matrices or of the core's above, by the module's own dispatch_counts:
    each case's forward and backward run again here with its test's settings, unjudged (~4 s on
    the CPU). A path that no case takes fails here, by name."""
    device = devices.require(device_name)
    assert set(DISPATCH_ELSEWHERE) <= set(DISPATCH_PATHS)
    runs = [(cases, None) for cases in MATRICES.values()] + list(CORE_MATRICES.values())
    total: collections.Counter = collections.Counter()
    for cases, split in runs:
        for case in cases(device_name):
            if case.invalid_reason() or ADAPTER.declines(case):
                continue
            with monkeypatch.context() as patch, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the matrices' coerced windows warn
                counts = core_settings(patch, case, split)
                rng = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
                inputs = make_inputs(case, device, rng)
                module = ADAPTER.build(case, None if case.default_scale else case.softmax_scale)
                run_impl(ADAPTER, module, case, inputs)
            total.update(counts)
    missing = [p for p in DISPATCH_PATHS if not total[p] and p not in DISPATCH_ELSEWHERE]
    assert not missing, f"no case takes {missing}; counts: {dict(total)}"


# the mask mode of the te_fast softmax each one-key variant's forward takes: a causal kernel, or
# the explicitly masked one (its op by the registry: te_fast._registry.SOFTMAX_BY_MASK_MODE)
ONE_KEY_MASK_MODE = {
    "causal": _registry.TOP_LEFT_CAUSAL,
    "causal_bottom_right": _registry.BOTTOM_RIGHT_CAUSAL,
    "arbitrary": _registry.EXPLICIT_MASK,
    "padding": _registry.EXPLICIT_MASK,
}


@pytest.mark.parametrize("device_name", devices.device_params())
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(ONE_KEY))
def test_one_kept_key_on_every_path(variant, dtype_name, device_name, monkeypatch):
    """A row that keeps one key gives that key's value row bit for bit (suites/checks/
    one_key.py) down the causal or masked softmax kernel the forward must take (the module's
    dispatch counters): through the ops path, and for bf16 also through the eager core (its
    size threshold lowered to 0)."""
    device = devices.require(device_name)
    gen = torch.Generator().manual_seed(list(ONE_KEY).index(variant) * 7 + len(dtype_name))
    call = one_key_call(variant, dtype_name, device, gen)
    kind = _registry.SOFTMAX_BY_MASK_MODE[ONE_KEY_MASK_MODE[variant]].public
    for path in ("ops", "core") if dtype_name != "fp32" else ("ops",):
        if path == "core":
            monkeypatch.setattr(UnfusedDotProductAttention, "core_min_score_bytes", 0)
        counts = collections.Counter()
        monkeypatch.setattr(UnfusedDotProductAttention, "dispatch_counts", counts)
        assert_rows_are_value_rows(ADAPTER, *call, where=f"{variant} ({path} path)")
        took = f"{path}:{kind}"
        assert counts[took] == 1, f"{variant}: expected one forward down {took}, took {counts}"
