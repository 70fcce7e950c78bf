"""Runs one attention case on an adapter and judges it against te_ref (SPEC §6)."""

from __future__ import annotations

import dataclasses
import zlib

import torch

from te_conformance.reports import record
from te_conformance.suites import devices, expected, features, skips
from te_conformance.suites.adapters import Adapter, ready
from te_conformance.suites.adapters.te_ref import TeRef
from te_conformance.suites.cases import DTYPES, AttnCase, AttnInputs, make_inputs
from te_conformance.suites.checks import contracts, coverage
from te_conformance.suites.checks.numerics import (
    K_BACKWARD,
    K_FORWARD,
    CheckError,
    check_ratio,
    raise_failures,
)
from te_conformance.suites.checks.rounding import RandomRounding

GRAD_NAMES = {"bias": "dbias", "offset": "dsoftmax_offset"}
# randomly rounded composites per judged case (SPEC §6; suites/checks/rounding.py)
ROUNDED_RUNS = 3


def prepare(
    adapter: Adapter, case: AttnCase, impl_name: str | None = None, needs=()
) -> tuple[torch.device, AttnInputs]:
    """Record the case, skip (recorded with its kind and reasons: suites/adapters ready) what
    cannot run here, and build its inputs."""
    record.case(impl=impl_name or adapter.name, **case.fields())
    device = ready(adapter, case, *needs)
    rng = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    return device, make_inputs(case, device, rng)


def prepare_run(
    adapter: Adapter, case: AttnCase, impl_name: str | None = None, substitute: bool = False,
    needs=(), values: bool = False,
) -> tuple[AttnCase, torch.device, AttnInputs]:
    """prepare() for the case as the adapter runs it (suites/checks/coverage.py): without an
    output it does not return (recorded as ``not_judged``), and with ``substitute`` (test_broad)
    each feature it declines replaced by the nearest it takes (recorded as ``substituted``, with
    the fields of the case that ran); skips, with the asked case's reasons, only what no variant
    can run. The inputs are seeded by the asked case's id. Returns (the case run, device,
    inputs); a case the adapter takes as asked is returned unchanged. ``values``: the test
    judges the call's values, so the case's features are recorded (suites/features.py): the
    asked case's where it cannot run, else the case that runs."""
    record.case(impl=impl_name or adapter.name, **case.fields())
    if values:  # the asked case's, until a substitute runs
        features.record_case_features(case)
    skips.unless("inexpressible", [case.invalid_reason()])
    found = coverage.runnable(adapter, case, substitute)
    if found is None:
        skips.skip("declined", adapter.declines(case, needs))
    run, notes = found
    if notes:
        record.case(**run.fields(), **notes)
        if values:  # what it declined of the asked case counts as not supported there
            features.record_substitute(case, run, adapter.declines(case))
    device = ready(adapter, run, *needs)
    rng = torch.Generator().manual_seed(zlib.crc32(case.id.encode()))
    return run, device, make_inputs(run, device, rng)


def _leaves_like(inputs: AttnInputs, dtype_of) -> dict[str, torch.Tensor]:
    return {n: t.detach().to(dtype_of(n, t)).requires_grad_() for n, t in inputs.leaves.items()}


def reference(
    case: AttnCase, inputs: AttnInputs, compute: str, scale: float, rounding_seed: int | None = None
):
    """(out, max_logit, grads by leaf name) of te_ref (the TeRef adapter) from the same inputs,
    on the inputs' device: ``compute`` "float64" (ref64) or "same_precision" (ref_lp, in the
    case's dtype). ref64 is computed on devices.reference_device (CUDA where there is one, for
    CPU cases too) and comes back; ref_lp runs where the case does, as its rounding is the
    bound's (SPEC §6). max_logit is computed whether or not the case asks for it. With
    ``rounding_seed``, a float64 run is a randomly rounded composite (suites/checks/rounding.py:
    each rounding operation's result moved within half an ulp of the case's dtype)."""
    if rounding_seed is not None:
        if compute != "float64":
            raise ValueError("reference: random rounding perturbs the float64 computation")
        with RandomRounding(DTYPES[case.dtype], rounding_seed):
            return reference(case, inputs, compute, scale)
    ref = TeRef(compute)
    compute_dtype = ref.compute_dtype(case)

    def dtype_of(name, t):
        return t.dtype if name == "offset" and compute_dtype != torch.float64 else compute_dtype

    home = inputs.grad_out.device
    on = devices.reference_device(home) if compute_dtype == torch.float64 else home
    if on != home:
        inputs = dataclasses.replace(
            inputs,
            leaves={n: t.detach().to(on) for n, t in inputs.leaves.items()},
            kwargs=devices.to_device(inputs.kwargs, on),
            grad_out=inputs.grad_out.to(on),
        )
    leaves = _leaves_like(inputs, dtype_of)
    q, k, v, extra = inputs.views(leaves, case)
    with_max_logit = dataclasses.replace(case, return_max_logit=True)
    module = ref.build(with_max_logit, scale)
    out, max_logit, _ = ref.call(module, with_max_logit, q, k, v, {**inputs.kwargs, **extra})
    names = list(leaves)
    grads = torch.autograd.grad(out, [leaves[n] for n in names], inputs.grad_out.to(compute_dtype))
    return (
        out.detach().to(home), max_logit.detach().to(home),
        {n: g.to(home) for n, g in zip(names, grads)},
    )  # fmt: skip


def _tensors_of(values) -> list[torch.Tensor]:
    """The tensors among call arguments, those inside tuples and lists too (a padding mask given
    as (q_mask, kv_mask))."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found += _tensors_of(value)
    return found


def run_impl(adapter: Adapter, module, case: AttnCase, inputs: AttnInputs, watch=None):
    """(out, max_logit, grads by leaf name) of one forward and backward through ``module``.

    Results are cloned (CUDA-graph outputs are overwritten by the next replay). With ``watch``,
    every input tensor and dO must come through bit-identical (no hidden mutation), and neither
    the output nor a gradient may share storage with one of them (no undeclared alias).
    """
    leaves = _leaves_like(inputs, lambda n, t: t.dtype)
    q, k, v, extra = inputs.views(leaves, case)
    kwargs = {**inputs.kwargs, **extra}
    watched = [*leaves.values(), inputs.grad_out]
    watched += [
        t for t in _tensors_of(kwargs.values())
        if all(t is not w for w in watched)
    ]  # fmt: skip
    before = contracts.snapshot(watched) if watch else None
    out, max_logit, stand_in = adapter.call(module, case, q, k, v, kwargs)
    targets = {**leaves, **stand_in}
    names = list(targets)
    grads = torch.autograd.grad(out, [targets[n] for n in names], inputs.grad_out)
    if watch:
        contracts.assert_untouched("input after forward and backward", before)
        contracts.assert_fresh_storage([out, *grads], watched)
    clone = None if max_logit is None else max_logit.detach().clone()
    return out.detach().clone(), clone, {n: g.clone() for n, g in zip(names, grads)}


def _named(case: AttnCase, inputs: AttnInputs, result) -> dict[str, torch.Tensor]:
    """{tensor name: tensor} of one (out, max_logit, grads) result: out, dq/dk/dv, dbias and
    dsoftmax_offset where its grads have them, max_logit where present."""
    out, max_logit, grads = result
    named = {"out": out, **dict(zip(("dq", "dk", "dv"), inputs.views(grads, case)[:3]))}
    named.update({GRAD_NAMES[leaf]: grads[leaf] for leaf in GRAD_NAMES if leaf in grads})
    return {**named, "max_logit": max_logit}


def compared_tensors(
    case: AttnCase, inputs: AttnInputs, impl, ref64, ref_lp, rounded=()
) -> list[tuple]:
    """(name, impl, ref64, ref_lp, k, [the same tensor of each randomly rounded composite]) of
    every tensor the error-ratio rule judges: the output, dq/dk/dv, dbias and dsoftmax_offset
    where present, max_logit where asked for."""
    got = _named(case, inputs, impl)
    want, lp = _named(case, inputs, ref64), _named(case, inputs, ref_lp)
    others = [_named(case, inputs, r) for r in rounded]
    names = [n for n in got if n != "max_logit"] + (["max_logit"] if case.return_max_logit else [])
    return [
        (n, got[n], want[n], lp[n], K_FORWARD if n in ("out", "max_logit") else K_BACKWARD,
         [o[n] for o in others])
        for n in names
    ]  # fmt: skip


def structural_failures(case: AttnCase, inputs: AttnInputs, impl, ref64) -> list[CheckError]:
    """What must hold exactly, whatever the rounding: output dtype and shape, max_logit's shape
    and dtype (each raised at once: nothing else can be judged without them), exact zeros where
    the float64 reference has whole zero rows (padding, fully masked rows, tokens past
    cu_seqlens[-1]), and no NaN (returned)."""
    out, max_logit, grads = impl
    out64 = ref64[0]
    dtype = DTYPES[case.dtype]
    if out.dtype != dtype:
        raise CheckError.new("dtype", "out", f"output dtype {out.dtype}, expected {dtype}")
    if out.shape != out64.shape:
        raise CheckError.new(
            "shape", "out", f"output shape {tuple(out.shape)}, expected {tuple(out64.shape)}"
        )
    if case.return_max_logit:
        if max_logit is None or max_logit.shape != (case.h,):
            raise CheckError.new("shape", "max_logit", "max_logit must be [h]")
        if max_logit.dtype != torch.float32:
            raise CheckError.new("dtype", "max_logit", f"max_logit dtype {max_logit.dtype}")
    failures: list[CheckError] = []
    zero_rows = (out64 == 0).all(dim=-1)  # (sq, b) | (b, sq) | (t,): nothing to attend to
    dq = inputs.views(grads, case)[0]
    for name, t in (("out", out), ("dq", dq.flatten(-2))):
        bad = int((t[zero_rows] != 0).any(dim=-1).sum()) if zero_rows.any() else 0
        if bad:
            failures.append(CheckError.new(
                "zero_rows", name,
                f"{name}: {bad} rows that are exactly 0 in the float64 reference (padding, fully "
                "masked, past cu_seqlens[-1]) are not exactly 0",
            ))  # fmt: skip
    for name, t in [("out", out), *[(GRAD_NAMES.get(n, f"d{n}"), g) for n, g in grads.items()]]:
        if torch.isnan(t).any():
            failures.append(CheckError.new("nan", name, f"{name} has NaN"))
    return failures


def judge(case: AttnCase, inputs: AttnInputs, impl, ref64, ref_lp, rounded=()) -> None:
    """Output, every gradient and max_logit under the error-ratio rule (with ``rounded``, the
    randomly rounded composites: SPEC §6); exact zeros where the float64 reference has whole
    zero rows (padding, fully masked rows, trailing tokens).

    Each failure is a CheckError naming its tensor and check; one alone is raised as itself
    (a known failure expects exactly that: suites/known_failures.py), several as one
    JudgementError holding them all."""
    dtype = DTYPES[case.dtype]
    structure = structural_failures(case, inputs, impl, ref64)  # raises on dtype and shapes
    failures: list[AssertionError] = []
    for name, a, r, lp, k, others in compared_tensors(case, inputs, impl, ref64, ref_lp, rounded):
        try:  # SPEC §6: every floor is the case's dtype's (dsoftmax_offset's too, an fp32 sum
            # of the case's roundings; max_logit's tiny-tensor term is 1 ulp: check_ratio)
            check_ratio(name, a, r, lp, k, dtype, others)
        except AssertionError as e:
            failures.append(e)
    raise_failures(failures + structure)


def judge_against_reference(case: AttnCase, inputs: AttnInputs, impl) -> None:
    """judge() with the references computed from the same inputs: float64, the same-precision
    composite and ROUNDED_RUNS randomly rounded composites (seeded by the case)."""
    scale = case.softmax_scale
    ref64, ref_lp, rounded = references(case, inputs, scale, zlib.crc32(case.id.encode()))
    judge(case, inputs, impl, ref64, ref_lp, rounded)


def references(case: AttnCase, inputs: AttnInputs, scale: float, seed: int):
    """(ref64, ref_lp, [ROUNDED_RUNS randomly rounded composites, seeded from ``seed``]): what
    SPEC §6's rule judges a result against."""
    ref64 = reference(case, inputs, "float64", scale)
    ref_lp = reference(case, inputs, "same_precision", scale)
    rounded = [
        reference(case, inputs, "float64", scale, rounding_seed=zlib.crc32(f"{seed}:{i}".encode()))
        for i in range(ROUNDED_RUNS)
    ]  # fmt: skip
    return ref64, ref_lp, rounded


def check_case(adapter: Adapter, case: AttnCase, substitute: bool = False) -> None:
    """The whole judgement of one eager case: implementation vs te_ref float64/same-precision,
    of the case as the adapter runs it (prepare_run: max_logit left out where the adapter
    returns none; with ``substitute``, declined features replaced by the nearest taken)."""
    case, _, inputs = prepare_run(adapter, case, substitute=substitute, values=True)
    module = adapter.build(case, None if case.default_scale else case.softmax_scale)
    impl = run_impl(adapter, module, case, inputs, watch=True)
    judge_with_deviations(adapter, case, inputs, impl)


# ----------------------------------------------------------------------------- deviations


def known_deviations(adapter: Adapter, case: AttnCase, inputs: AttnInputs) -> list:
    """The expectations (suites/expected.py) of the adapter's per-case hook for this case
    (Adapter.known_deviations: TE's recorded deviations, SPEC §7), asked with its lengths and
    forward arguments."""
    lengths = (inputs.lengths_q, inputs.lengths_kv)
    found = adapter.known_deviations(case, lengths=lengths, call_kwargs=inputs.kwargs)
    return [expected.from_deviation(d, adapter.name) for d in found]


def judge_with_deviations(adapter: Adapter, case: AttnCase, inputs: AttnInputs, impl) -> None:
    """judge_against_reference(), where the deviations the adapter's hook names for the case
    are expected (suites/expected.py: the case must fail, and only by the checks they explain;
    a pass fails as "no longer shows")."""
    expected.expect(*known_deviations(adapter, case, inputs))
    judge_against_reference(case, inputs, impl)
