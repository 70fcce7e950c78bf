"""The SPEC §3-4 contract assertions, shared by the suites and proven able to fail by
suites/judge/test_selftest.py (each one is run there against a deliberately broken op)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch._inductor.cudagraph_trees
from torch._dynamo.utils import counters

from te_conformance.suites.checks.numerics import assert_bitwise_equal


def _tensors(args) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of t's storage (not just the view) as a uint8 tensor sharing it."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def snapshot(tensors: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(the live bytes, a copy) of each tensor's whole storage: a write anywhere in a storage an
    input lives in, inside its view or not, is a write to the input."""
    return [(storage_bytes(t), storage_bytes(t).clone()) for t in tensors]


def assert_untouched(name: str, saved) -> None:
    """Every storage ``snapshot`` saved is byte-identical to its copy (no input, or dy, was
    written)."""
    for i, (live, before) in enumerate(saved):
        if not torch.equal(live, before):
            n = int((live != before).sum())
            raise AssertionError(
                f"{name} #{i}: {n} bytes of its storage changed: an input was written "
                "(mutates_args=() is a lie)"
            )


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def assert_fresh_storage(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]):
    """No output shares storage with any input."""
    for o in outputs:
        o0, o1 = storage_span(o)
        for t in inputs:
            t0, t1 = storage_span(t)
            if o0 < t1 and t0 < o1 and o1 > o0 and t1 > t0:
                raise AssertionError("an output shares storage with an input (undeclared alias)")


@contextlib.contextmanager
def poisoned_allocations():
    """torch's deterministic mode with ``fill_uninitialized_memory`` for the block (warn_only: no
    op is refused): every empty tensor that aten allocates (aten::empty and its kin, on the CPU
    and CUDA, a custom op's output included) starts as NaN (floating dtypes, fp8 included) or
    the dtype's max (integers). The previous settings come back afterwards."""
    import torch.utils.deterministic as deterministic

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def poison_fills(fn: Callable[[], object]) -> tuple[object, set[tuple[int, tuple[int, ...]]]]:
    """(fn(), the buffers poisoned while it ran): fn() under poisoned_allocations, with the
    profiler's event tree giving (storage data pointer, shape) of every tensor that the poison
    filled (an aten::fill_ run by an aten::empty*, which is how the deterministic fill runs)."""
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    )
    with poisoned_allocations(), profiler as prof:
        result = fn()
    try:
        tree = prof.profiler.kineto_results.experimental_event_tree()
        torch_op = torch._C._profiler._EventType.TorchOp
        metadata = torch._C._profiler._TensorMetadata
    except AttributeError as e:  # a torch without the event tree: no way to see the poison
        raise AssertionError(f"cannot observe the poison on this torch's profiler: {e}") from None
    fills = set()
    stack = [(event, "") for event in tree]  # (event, its parent's name)
    while stack:
        event, parent = stack.pop()
        stack.extend((child, event.name) for child in event.children)
        if event.name != "aten::fill_" or not parent.startswith("aten::empty"):
            continue
        kind, fields = event.typed
        target = fields.inputs[0] if kind == torch_op and fields.inputs else None
        if isinstance(target, metadata):
            fills.add((target.storage_data_ptr, tuple(target.sizes)))
    return result, fills


def assert_fully_written(name: str, fn: Callable[[], torch.Tensor], expected: torch.Tensor):
    """fn()'s output, allocated under poisoned_allocations, holds no poison and equals
    ``expected`` bit for bit. Not vacuously: the poison must be seen filling the very buffer fn()
    returns (its storage and shape, before fn wrote it), and the poison must be NaN in the
    output's dtype."""
    out, fills = poison_fills(fn)
    key = (out.untyped_storage().data_ptr(), tuple(out.shape))
    if key not in fills:
        raise AssertionError(
            f"{name}: the poison was not seen in the output's buffer {key} (poisoned: "
            f"{sorted(fills)}): the check would be void"
        )
    with poisoned_allocations():
        probe = torch.empty(8, dtype=out.dtype, device=out.device)
    if not torch.isnan(probe.float()).all():
        raise AssertionError(f"{name}: the poison is no NaN in {out.dtype}: the check is void")
    unwritten = torch.isnan(out.float())
    if unwritten.any():
        raise AssertionError(
            f"{name}: {int(unwritten.sum())} of {out.numel()} output elements were left unwritten "
            f"(poison NaN), first at {unwritten.nonzero()[0].tolist()}"
        )
    assert_bitwise_equal(f"{name}: output over a poisoned buffer", out, expected)


@contextlib.contextmanager
def sync_debug_error():
    """torch.cuda.set_sync_debug_mode('error') for the block."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def assert_no_host_sync(fn: Callable[[], object]) -> None:
    """fn() runs under torch.cuda.set_sync_debug_mode('error') without a synchronising call."""
    try:
        with sync_debug_error():
            fn()
    except RuntimeError as e:
        raise AssertionError(f"host synchronisation: {e}") from None
    torch.cuda.synchronize()


def assert_graph_replay_matches_eager(
    fn: Callable[..., torch.Tensor], static_args: list, refresh: Callable[[list], None], replays=3
) -> None:
    """Capture fn(*static_args) with torch.cuda.graph (on its side stream), refresh the inputs in
    place, replay, and require the eager result bit for bit. A launch on another stream or a
    host sync inside fn makes the capture fail; stale or partial writes make replay differ."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*static_args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static_args)
    except RuntimeError as e:
        torch.cuda.synchronize()
        raise AssertionError(f"CUDA graph capture failed (wrong stream or a sync?): {e}") from None
    for _ in range(replays):
        refresh(static_args)
        graph.replay()
        assert_bitwise_equal("graph replay vs eager", out, fn(*static_args))


# ----------------------------------------------------------------------------- torch.compile


def reset_compile_state() -> None:
    """Fresh dynamo caches, CUDA-graph trees and counters, so one case cannot leak into the next."""
    torch._dynamo.reset()
    reset_trees = getattr(torch._inductor.cudagraph_trees, "reset_cudagraph_trees", None)
    if reset_trees is not None:
        reset_trees()
    counters.clear()


def compile_counters() -> dict:
    """What the report records about a compiled case."""
    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "unique_graphs": counters["stats"]["unique_graphs"],  # graphs dynamo compiled
    }


def assert_no_graph_breaks() -> None:
    breaks = dict(counters["graph_break"])
    if breaks:
        raise AssertionError(f"graph breaks: {breaks}")


def assert_no_cudagraph_skips() -> None:
    skips = counters["inductor"]["cudagraph_skips"]
    if skips:
        raise AssertionError(f"{skips} CUDA graph(s) skipped (see the 'skipping cudagraphs' log)")


def count_graph_launches(fn: Callable[[], object]) -> int:
    """How many CUDA graphs fn() launches, from the profiler's cudaGraphLaunch runtime calls."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.name.startswith("cudaGraphLaunch"))


def assert_graphs_replayed(launches: int, expected: int = 2) -> None:
    """The positive signal: forward and backward ran as replayed CUDA graphs (>= 2 launches)."""
    if launches < expected:
        raise AssertionError(
            f"{launches} CUDA graph launch(es) in a steady-state iteration, expected >= {expected} "
            "(forward and backward): nothing (or not everything) was captured and replayed"
        )
