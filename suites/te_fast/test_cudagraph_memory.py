"""te_fast under CUDA graphs: 100 replays of a compiled (mode="reduce-overhead") forward and
backward leave the allocator's memory flat (the conformance of every adapter under torch.compile
and CUDA graphs: suites/conformance/test_compile.py)."""

from __future__ import annotations

import gc

import pytest
import torch
from torch._dynamo.utils import counters

from te_conformance.reports import record
from te_conformance.suites.adapters import ADAPTERS
from te_conformance.suites.cases import AttnCase, sized
from te_conformance.suites.checks import contracts
from te_conformance.suites.checks.attention import (
    prepare,
    run_impl,
)


@pytest.mark.gpu
def test_replays_leave_memory_flat():
    """100 replays of forward and backward leave torch.cuda.memory_allocated() unchanged
    (te_fast's own contract: the test has no adapter axis)."""
    adapter = ADAPTERS["te_fast"]
    case = sized(AttnCase("bshd_bshd_bshd", "bf16", "causal"))
    _, base = prepare(adapter, case, "te_fast.cudagraph")
    contracts.reset_compile_state()
    module = adapter.build(case, case.d**-0.5)
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    rng = torch.Generator().manual_seed(7)
    inputs = base.with_fresh_values(rng)

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        run_impl(adapter, compiled, case, inputs)

    for _ in range(3):
        step()
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(100):
        step()
    gc.collect()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    record.case(memory_allocated_before=before, memory_allocated_after=after)
    assert after == before, f"memory_allocated grew by {after - before} bytes over 100 replays"
    contracts.assert_no_cudagraph_skips()
    assert counters["inductor"]["cudagraph_skips"] == 0
