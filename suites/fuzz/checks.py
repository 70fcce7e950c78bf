"""Examples for the property-based suites: what one drawn op or module call is (plain data), how
its inputs are built, and every check one example must pass. No hypothesis import here: a
failing example is reproduced with `check_*_example(<the printed example>, device)`.

Each op example checks, in this order: the output shares no storage with any input (byte spans
of the storages, not pointers); no byte of any input's whole storage changed (gaps of strided
views and the bytes before a storage offset included); the registered fake gives the real
output's shape, dtype and strides; the numerics equal te_ref's under SPEC §6 (conversions:
exactly). `impl` is how the op is called: the te_fast op itself, or a deliberately broken
stand-in from suites/checks/broken_ops.py that the self-tests feed in.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import te_ref
from te_conformance.reports import record
from te_conformance.suites import devices, expected
from te_conformance.suites.adapters import ADAPTERS, default_adapter
from te_conformance.suites.cases import AttnCase, make_inputs
from te_conformance.suites.checks import contracts
from te_conformance.suites.checks.attention import judge, known_deviations, references
from te_conformance.suites.checks.numerics import (
    K_BACKWARD,
    K_FORWARD,
    check_exact,
    check_ratio,
    raise_failures,
)
from te_conformance.suites.op_cases import OP_DTYPES

OpImpl = Callable[..., torch.Tensor]  # (op name, *args) -> output


def te_fast_op(name: str, *args) -> torch.Tensor:
    """The real op: torch.ops.te_fast.<name>.default(*args)."""
    return getattr(torch.ops.te_fast, name).default(*args)


# ----------------------------------------------------------------------------- memory layouts
# How a drawn tensor sits in memory. Every layout holds the same values; only strides, storage
# offsets and the bytes around the view change.
#   "contiguous"      a fresh contiguous tensor
#   "offset<k>"       contiguous, starting k elements into its storage (k odd: misaligned)
#   "strided"         every other element of the last dim of a twice-as-wide buffer
#   "transposed"      the last two dims stored swapped (column-major rows)
#   "expanded"        one dim broadcast (stride 0) from its first slice: dim 1 when it is longer
#                     than 1, else dim -2; the values repeat along it
LAYOUTS = ("contiguous", "offset1", "offset3", "offset8", "strided", "transposed", "expanded")


def place(t: torch.Tensor, layout: str, gen: torch.Generator) -> torch.Tensor:
    """t's values (for "expanded": its first slice along one dim, repeated) in ``layout``."""
    if layout == "contiguous":
        return t.clone()
    if layout.startswith("offset"):
        k = int(layout[len("offset") :])
        buf = _filler(t.numel() + k, t.dtype, t.device, gen)
        view = buf[k:].view(t.shape)
        view.copy_(t)
        return view
    if layout == "strided" and t.dim() >= 1:
        buf = _filler(t.numel() * 2, t.dtype, t.device, gen).view(*t.shape[:-1], 2 * t.shape[-1])
        view = buf[..., ::2]
        view.copy_(t)
        return view
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "expanded" and t.dim() >= 2:
        dim = _expand_dim(t)
        return t.narrow(dim, 0, min(1, t.shape[dim])).clone().expand(t.shape)
    return t.clone()  # a layout the rank cannot take: contiguous


def _expand_dim(t: torch.Tensor) -> int:
    return 1 if t.shape[1] > 1 else t.dim() - 2


def _filler(n: int, dtype, device, gen) -> torch.Tensor:
    """Random bytes-worth of values for the parts of a buffer outside the view."""
    if dtype == torch.bool:
        return torch.rand(n, generator=gen).lt(0.5).to(device)
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(device=device, dtype=dtype)
    return torch.randint(-9, 9, (n,), generator=gen).to(device=device, dtype=dtype)


def logical(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The values an input placed in ``layout`` really holds (expanded repeats its first slice)."""
    if layout == "expanded" and t.dim() >= 2:
        dim = _expand_dim(t)
        return t.narrow(dim, 0, min(1, t.shape[dim])).expand(t.shape).clone()
    return t


# ----------------------------------------------------------------------------- contract checks


def assert_no_alias(what: str, outputs, inputs) -> None:
    """No output's storage overlaps any input's (byte spans of the storages)."""
    try:
        contracts.assert_fresh_storage(
            [o for o in outputs if o is not None and o.untyped_storage().nbytes()],
            [t for t in inputs if t.untyped_storage().nbytes()],
        )
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def assert_fake_matches(name: str, args: tuple, out: torch.Tensor) -> None:
    """The op's registered fake, on fake copies of the same arguments (same strides and storage
    offsets), gives the real output's shape, dtype and strides."""
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in plain]
        fake = te_fast_op(name, *fake_args)
    got = (tuple(fake.shape), fake.dtype, tuple(fake.stride()))
    want = (tuple(out.shape), out.dtype, tuple(out.stride()))
    if got != want:
        raise AssertionError(
            f"{name}: the fake gives (shape, dtype, strides) {got}, the real op {want}"
        )


def call_checked(impl: OpImpl, name: str, args: tuple) -> torch.Tensor:
    """One op call under the contract checks: fresh storage, inputs untouched, fake = real."""
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    saved = contracts.snapshot(inputs)
    out = impl(name, *args)
    assert_no_alias(name, [out], inputs)
    contracts.assert_untouched(name, saved)
    assert_fake_matches(name, args, out)
    return out


def describe(t: torch.Tensor) -> str:
    """A tensor argument in one line: dtype, shape, strides, storage offset."""
    return (
        f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} stride={list(t.stride())} "
        f"offset={t.storage_offset()}"
    )


def _arg_text(a) -> str:
    if isinstance(a, torch.Tensor):
        return describe(a)
    if isinstance(a, (tuple, list)):
        return "(" + ", ".join(_arg_text(x) for x in a) + ")"
    return repr(a)


def call_text(name: str, args: tuple) -> str:
    return f"torch.ops.te_fast.{name}({', '.join(_arg_text(a) for a in args)})"


@contextlib.contextmanager
def _quiet():
    """Numerics of one example are not recorded in the report (a fuzz test has hundreds)."""
    with record.suspended():
        yield


def _note(text: str) -> None:
    """hypothesis.note when running under hypothesis (the note is printed with a failure)."""
    try:
        from hypothesis import note
        from hypothesis.control import current_build_context

        current_build_context()
    except Exception:  # not under hypothesis (or not installed): plain reproduction
        return
    note(text)


def _note_reproducer(command: str) -> None:
    """Print the command with a failing example (hypothesis' notes) and record it with the case
    (the report's ``reproducer``: suites/expected.py note_reproducer)."""
    _note(f"reproduce (from the repository root): {command}")
    expected.note_reproducer(command)


def reproducer(check: str, example, device: str, adapter=None) -> str:
    """The line that runs the check on the example again; ``adapter`` (unless it is the
    registry's default, the check's own) by its name in ADAPTERS, or a comment naming it where
    it is not registered there."""
    args, tail = f"{example!r}, {device!r}", ""
    if adapter is not None and adapter is not default_adapter():
        if ADAPTERS.get(adapter.name) is adapter:
            args += f", ADAPTERS[{adapter.name!r}]"
        else:
            tail = f"  # with adapter {adapter.name} ({type(adapter).__module__})"
    return (
        "PYTHONPATH=. python -c "
        f'"from te_conformance.suites.fuzz.checks import *; {check}({args})"{tail}'
    )


# ----------------------------------------------------------------------------- softmax ops


@dataclass(frozen=True)
class SoftmaxExample:
    """One forward and backward call of a softmax op pair, as data.

    shape: x's shape ([b, h, sq, sk], or [attn_batches, sq, sk] for the upper-triangular op);
    mask_per_batch: the masked op's mask is [b, 1, sq, sk] (else [1, 1, sq, sk]);
    mask_density: share of masked columns; masked_row: a query row index whose every column is
    masked (-1: none); neg_inf: share of scores set to -inf (only with scale > 0); range_end:
    scores of 0.75 to 1 times the dtype's largest magnitude instead of ``magnitude``'s, one sign
    a row (only with 0 < |scale| <= 1, where the same-precision reference stays finite; for bf16
    the kernels' scale * log2 e times such a score is past fp32's range); *_layout: memory
    layouts (see LAYOUTS).
    """

    op: str  # a forward op's public name, e.g. "scaled_masked_softmax"
    dtype: str
    shape: tuple[int, ...]
    scale: float
    magnitude: float = 2.0
    x_layout: str = "contiguous"
    dy_layout: str = "contiguous"
    y_layout: str = "contiguous"
    mask_per_batch: bool = False
    mask_density: float = 0.3
    masked_row: int = -1
    mask_layout: str = "contiguous"
    neg_inf: float = 0.0
    seed: int = 0
    range_end: bool = False


def softmax_inputs(ex: SoftmaxExample, device) -> dict:
    """x (placed), mask (placed, masked op only), dy: the example's inputs on ``device``."""
    gen = torch.Generator().manual_seed(ex.seed)
    dtype = OP_DTYPES[ex.dtype]
    x = torch.randn(ex.shape, generator=gen) * ex.magnitude
    if dtype == torch.float16:  # scale * x inside fp16's range, where the composite can judge it
        limit = 6e4 / max(1.0, abs(ex.scale))
        x = x.clamp(-limit, limit)
    if ex.range_end:
        sign = torch.where(torch.rand(ex.shape[:-1] + (1,), generator=gen) < 0.5, -1.0, 1.0)
        u = 0.75 + 0.25 * torch.rand(ex.shape, generator=gen)
        x = sign * u * torch.finfo(dtype).max
    if ex.neg_inf > 0:
        x = x.masked_fill(torch.rand(ex.shape, generator=gen) < ex.neg_inf, float("-inf"))
    x = place(x.to(device=device, dtype=dtype), ex.x_layout, gen)
    mask = None
    if ex.op == "scaled_masked_softmax":
        b, _, sq, sk = ex.shape
        mshape = (b if ex.mask_per_batch else 1, 1, sq, sk)
        m = torch.rand(mshape, generator=gen) < ex.mask_density
        if 0 <= ex.masked_row < sq:
            m[:, :, ex.masked_row] = True
        mask = place(m.to(device), ex.mask_layout, gen)
    dy = torch.randn(ex.shape, generator=gen).to(device=device, dtype=dtype)
    return {"x": x, "mask": mask, "dy": dy, "gen": gen}


def check_softmax_example(ex: SoftmaxExample, device: str, impl: OpImpl = te_fast_op) -> None:
    """The forward op on (x, [mask,] scale) and the backward op on (dy, y, scale), each under
    the contract checks; y and dx against te_ref (float64 and same precision), each judged on
    this draw alone by check_ratio, SPEC §6's rule as the deterministic suites apply it."""
    _note_reproducer(reproducer("check_softmax_example", ex, device))
    compared = _softmax_draw(ex, torch.device(device), impl, checked=True)
    failures = []
    for name, a, r, lp, k in compared:
        try:
            with _quiet():
                check_ratio(name, a, r, lp, k, OP_DTYPES[ex.dtype])
        except AssertionError as e:
            failures.append(e)
    raise_failures(failures)


def _softmax_draw(ex: SoftmaxExample, dev, impl: OpImpl, checked: bool = False) -> list[tuple]:
    """Run one draw of the example; [(name, impl, ref64, ref_lp, k)] for y and dx. ``checked``:
    each call under the contract checks (alias, mutation, fake)."""
    dtype = OP_DTYPES[ex.dtype]
    inp = softmax_inputs(ex, dev)
    x, mask, dy, gen = inp["x"], inp["mask"], inp["dy"], inp["gen"]
    fwd, bwd = f"{ex.op}_fwd", f"{ex.op}_bwd"
    args = (x, mask, ex.scale) if mask is not None else (x, ex.scale)
    if checked:
        _note(call_text(fwd, args))
    y = call_checked(impl, fwd, args) if checked else impl(fwd, *args)
    assert y.dtype == dtype and y.shape == x.shape, f"{fwd}: y {y.dtype} {tuple(y.shape)}"
    dy_in = place(dy, ex.dy_layout, gen)
    y_in = place(y, ex.y_layout, gen)
    dy_vals, y_vals = logical(dy_in, ex.dy_layout), logical(y_in, ex.y_layout)
    bargs = (dy_in, y_in, ex.scale)
    if checked:
        _note(call_text(bwd, bargs))
    dx = call_checked(impl, bwd, bargs) if checked else impl(bwd, *bargs)

    ref = getattr(te_ref, ex.op)
    mask_vals = None if mask is None else logical(mask, ex.mask_layout)
    extra = (mask_vals,) if mask is not None else ()
    x_vals = logical(x, ex.x_layout)
    refs = {}
    for compute in (torch.float64, dtype):  # ref64 on devices.reference_device, back on dev
        on = devices.reference_device(dev) if compute == torch.float64 else dev
        xr = x_vals.detach().to(device=on, dtype=compute).requires_grad_()
        yr = ref(xr, *devices.to_device(extra, on), ex.scale, compute_dtype=compute)
        yr.backward(dy.to(device=on, dtype=compute))
        refs[compute] = (yr.detach().to(dev), xr.grad.to(dev))
    compared = [("y", y, refs[torch.float64][0], refs[dtype][0], K_FORWARD)]
    if torch.equal(y_vals, y) and torch.equal(dy_vals, dy):
        compared.append(("dx", dx, refs[torch.float64][1], refs[dtype][1], K_BACKWARD))
    else:  # expanded dy/y hold other values than the forward's: the formula on them
        kept = te_ref.kept_columns(ex.op, y.shape[-2], y.shape[-1], dev)
        ref64, lp = softmax_bwd_refs(dy_vals, y_vals, ex.scale, dtype, kept)
        compared.append(("dx", dx, ref64, lp, K_BACKWARD))
    return compared


def softmax_bwd_refs(dy, y, scale, dtype, kept=None):
    """scale * y * (dy - sum(dy * y)) from the given dy and y: in float64 (te_ref's
    softmax_backward), and as the same-precision composite (torch's softmax backward in dtype,
    then the scale). kept (bool, True = kept; te_ref.kept_columns): a causal backward's columns,
    the only ones read (SPEC §3); dx is +0 past them."""
    ref64 = te_ref.softmax_backward(dy, y, scale, kept)
    if kept is not None:
        dy, y = dy.where(kept, 0.0), y.where(kept, 0.0)
    lp = torch._softmax_backward_data(dy.contiguous(), y.contiguous(), -1, dtype) * scale
    return ref64, lp if kept is None else lp.where(kept, 0.0)


# ----------------------------------------------------------------------------- conversions

CORRUPTIONS = (
    None,
    "non_monotone",
    "past_buffer",
    "negative",
    "nonzero_start",
    "too_long",
    "short_num_tokens",
)


@dataclass(frozen=True)
class ConvertExample:
    """One THD<->BSHD conversion, as data.

    lengths: per-sequence lengths (empty ones allowed; b = len(lengths)); pad: how much longer the
    padded side is than the longest sequence; trailing: tokens past cu_seqlens[-1];
    corruption: one bad-argument rule to break (None: a valid call), by `amount`.
    """

    direction: str  # "thd_to_bshd" | "bshd_to_thd"
    dtype: str
    lengths: tuple[int, ...]
    h: int = 2
    d: int = 3
    pad: int = 0
    trailing: int = 0
    data_layout: str = "contiguous"
    cu_layout: str = "contiguous"
    corruption: str | None = None
    where: int = 0  # which sequence boundary a corruption touches (mod b)
    amount: int = 0
    seed: int = 0


def convert_arguments(ex: ConvertExample, device) -> tuple[str, tuple, list[int]]:
    """(op name, op arguments, cu_seqlens as a list) of the example on ``device``."""
    gen = torch.Generator().manual_seed(ex.seed)
    dtype = OP_DTYPES[ex.dtype]
    b = len(ex.lengths)
    cu = [0]
    for n in ex.lengths:
        cu.append(cu[-1] + n)
    max_seqlen = max(ex.lengths, default=0) + ex.pad
    tokens = cu[-1] + ex.trailing
    c, k = ex.corruption, ex.amount
    i = 1 + ex.where % b if b else 0  # a boundary index 1..b
    if c == "non_monotone" and b >= 1:
        if i < b:
            cu[i] = cu[i + 1] + 1 + k
        else:
            cu[i] = cu[i - 1] - 1 - k
    elif c == "past_buffer" and b >= 1:
        cu[b] = tokens + 1 + k
    elif c == "negative" and b >= 1:
        cu[i] = -1 - k
    elif c == "nonzero_start":
        cu[0] = 1 + k if k % 2 == 0 else -1 - k
    elif c == "too_long" and max(ex.lengths, default=0) > 0:
        max_seqlen = max(0, max(ex.lengths) - 1 - k)
    elif c == "short_num_tokens" and cu[-1] > 0:
        tokens = max(0, cu[-1] - 1 - k)
    cu_t = place(torch.tensor(cu, dtype=torch.int32).to(device), ex.cu_layout, gen)
    if ex.direction == "thd_to_bshd":
        data = torch.randn(tokens, ex.h, ex.d, generator=gen)
        data = place(data.to(device=device).to(dtype), ex.data_layout, gen)
        return "convert_thd_to_bshd", (data, cu_t, b, max_seqlen), cu
    data = torch.randn(b, max_seqlen, ex.h, ex.d, generator=gen)
    data = place(data.to(device=device).to(dtype), ex.data_layout, gen)
    return "convert_bshd_to_thd", (data, cu_t, tokens), cu


def _te_ref_convert(name, args):
    """te_ref's conversion in float64, or the ValueError that says the call is invalid."""
    try:
        return getattr(te_ref, name)(*args), None
    except ValueError as e:
        return None, e


ARGUMENT_WORDS = re.compile(r"cu_seqlens|max_seqlen|num_tokens|thd\.shape\[0\]|bshd\.shape\[1\]")


def check_convert_example(ex: ConvertExample, device: str, impl: OpImpl = te_fast_op) -> None:
    """A valid call equals te_ref exactly (copies and zeros; NaN-free) under the contract
    checks. An invalid one (te_ref raises): on the CPU, and on CUDA with TE_FAST_DEBUG_CHECKS=1,
    a RuntimeError naming the op and the argument; on CUDA without it no error (no host sync)
    but every affected row NaN, exactly the rows that the kernels' rule marks."""
    _note_reproducer(reproducer("check_convert_example", ex, device))
    name, args, cu = convert_arguments(ex, torch.device(device))
    _note(call_text(name, args) + f"  # cu_seqlens = {cu}")
    ref, invalid = _te_ref_convert(name, args)
    if invalid is None:
        out = call_checked(impl, name, args)
        assert out.dtype == args[0].dtype, f"{name}: dtype {out.dtype}, expected {args[0].dtype}"
        with _quiet():
            check_exact(name, out, ref)
        return
    debug = os.environ.get("TE_FAST_DEBUG_CHECKS", "") not in ("", "0")
    if device == "cpu" or debug:
        try:
            impl(name, *args)
        except RuntimeError as e:
            message = str(e).split("\n")[0]
            assert message.startswith(f"te_fast: {name}") and ARGUMENT_WORDS.search(message), (
                f"{name}: the error for bad arguments ({invalid}) names neither the op nor the "
                f"argument: {message!r}"
            )
            return
        raise AssertionError(f"{name}: no error for bad arguments that te_ref rejects: {invalid}")
    out = impl(name, *args)  # CUDA, no debug checks: the kernels poison instead of raising
    expected_nan = poisoned_rows(name, args, cu)
    nan_rows = torch.isnan(out.float()).flatten(start_dim=-2).any(-1).cpu()
    assert torch.equal(nan_rows, expected_nan), (
        f"{name}: NaN rows {nan_rows.nonzero().flatten().tolist()} but the kernels' rule poisons "
        f"{expected_nan.nonzero().flatten().tolist()} (cu_seqlens {cu})"
    )


def _sequence_ok(cu, x, tokens, max_len) -> bool:
    """csrc/rules.h sequence_ok: the rule every kernel applies before touching a sequence."""
    start, end = cu[x], cu[x + 1]
    return cu[0] == 0 and start >= 0 and end >= start and end <= tokens and end - start <= max_len


def poisoned_rows(name: str, args: tuple, cu: list[int]) -> torch.Tensor:
    """Which output rows (bshd: [b, s]; thd: [t]) the CUDA kernels fill with NaN for bad
    cu_seqlens, by the rule of csrc/cuda/convert.cu written out in Python."""
    b = len(cu) - 1
    data = args[0]
    row_elems = data.shape[-1] * data.shape[-2]
    monotone = all(cu[x + 1] >= cu[x] for x in range(b))
    if name == "convert_thd_to_bshd":
        tokens, s = data.shape[0], args[3]
        rows = torch.zeros(b, s, dtype=torch.bool)
        for x in range(b):
            rows[x] = row_elems > 0 and not (monotone and _sequence_ok(cu, x, tokens, s))
        return rows
    tokens, s = args[2], data.shape[1]
    rows = torch.zeros(tokens, dtype=torch.bool)
    if row_elems == 0:  # nothing to write, nothing to poison
        return rows
    used = cu[b]
    if not (monotone and cu[0] == 0 and 0 <= used <= tokens):
        rows[:] = True
        return rows
    for r in range(used):  # the sequence of token r: the last x with cu[x] <= r
        x = max(x for x in range(b) if cu[x] <= r)
        rows[r] = not (_sequence_ok(cu, x, tokens, s) and r < cu[x + 1])
    return rows


# ----------------------------------------------------------------------------- the module


@dataclass(frozen=True)
class ModuleExample:
    """One UnfusedDotProductAttention forward and backward: an AttnCase and the input seed."""

    case: AttnCase
    seed: int = 0


def check_module_example(ex: ModuleExample, device: str, adapter=None) -> None:
    """te_fast's module (or ``adapter``) against te_ref on the example's one draw of values: the
    output and every gradient judged by suites/checks/attention.judge, the function and the
    SPEC §6 rule the deterministic suites use (exact zeros where te_ref has whole zero rows, no
    NaN); no output or gradient shares storage with an input; no byte of an input, mask,
    cu_seqlens or dO changes. A call that te_ref rejects must be rejected: by te_fast with the
    same ValueError (an adapter with the reference_messages capability, te_fast's), by another
    adapter that validates its arguments with one of its argument_errors; an adapter that does
    not validate is not judged on it. A call the adapter's
    recorded deviations (SPEC §7) explain is not judged either (the deterministic suites run
    those as strict expected failures; a drawn example cannot be one)."""
    adapter = adapter or default_adapter()
    case = replace(ex.case, device=device)
    _note_reproducer(reproducer("check_module_example", replace(ex, case=case), device, adapter))
    dev = torch.device(device)
    rng = torch.Generator().manual_seed(ex.seed)
    inputs = make_inputs(case, dev, rng)
    scale = case.softmax_scale  # scale_factor times d ** -0.5
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.leaves.items()}
    q, k, v, extra = inputs.views(leaves, case)
    kwargs = {**inputs.kwargs, **extra}
    _note(
        f"{'te_fast.UnfusedDotProductAttention' if adapter.name == 'te_fast' else adapter.name}("
        f"{scale!r}, attention_type={case.attention_type!r}, "
        f"softmax_type={case.softmax_type!r}, return_max_logit={case.return_max_logit})("
        f"q={describe(q)}, k={describe(k)}, v={describe(v)}, "
        + ", ".join(f"{n}={_arg_text(t)}" for n, t in kwargs.items())
        + ")"
    )
    try:
        with torch.no_grad():
            te_ref.dot_product_attention(
                q, k, v, softmax_scale=scale, softmax_type=case.softmax_type,
                attention_type=case.attention_type, **kwargs,
            )  # fmt: skip
        rejected = None
    except ValueError as e:
        rejected = e
    why = adapter.support.lacks(adapter.name, "validates_arguments", device)
    if rejected is not None and why is not None:
        _note(f"not judged: te_ref rejects the call ({rejected}); {why}")
        return
    if rejected is None and known_deviations(adapter, case, inputs):
        _note(f"not judged: explained by {known_deviations(adapter, case, inputs)}")
        return
    module = adapter.build(case, scale)
    tensors = [*leaves.values(), inputs.grad_out]
    for t in kwargs.values():
        for u in t if isinstance(t, (tuple, list)) else (t,):
            if isinstance(u, torch.Tensor) and all(u is not w for w in tensors):
                tensors.append(u)
    saved = contracts.snapshot(tensors)
    if rejected is not None:
        try:
            adapter.call(module, case, q, k, v, kwargs)
        except adapter.argument_errors as e:
            if adapter.support.has("reference_messages", device):
                assert str(e) == str(rejected), f"te_ref says {rejected}, {adapter.name} says {e}"
            return
        raise AssertionError(f"{adapter.name} accepted a call te_ref rejects: {rejected}")
    out, max_logit, stand_in = adapter.call(module, case, q, k, v, kwargs)
    assert_no_alias("output", [out, max_logit], tensors)
    targets = {**leaves, **stand_in}
    names = list(targets)
    grads = torch.autograd.grad(out, [targets[n] for n in names], inputs.grad_out)
    assert_no_alias("gradients", list(grads), tensors)
    contracts.assert_untouched("input after forward and backward", saved)
    impl = (out.detach(), None if max_logit is None else max_logit.detach(),
            dict(zip(names, grads)))  # fmt: skip
    with _quiet():
        ref64, ref_lp, rounded = references(case, inputs, scale, ex.seed)
        judge(case, inputs, impl, ref64, ref_lp, rounded)
