"""Dropout (SPEC §2.6 and §4, docs/SEMANTICS.md) through every adapter that declares it.

What: the probabilities are dropped with probability p and the kept ones scaled by 1/(1-p) (so
E[out] is the no-dropout output); off training, and at p = 0, the module is bitwise the
no-dropout module (forward and gradients); the backward uses the forward's mask; and dropout runs
inside the ``attention_dropout_ctx`` the module was given.

How: v = identity over key positions (dv = skv), so each output row is the dropped probability
row itself and the mask can be read off the forward (small q, k keep every probability well
above 0, so a 0 is a dropped entry). The older tests in test_attention.py (kept there, their ids
are in the baselines) count kept columns through v = 1 and check <out, dO> = <v, dv>.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch

from te_conformance.reports import record
from te_conformance.suites import devices, skips
from te_conformance.suites.adapters import ready
from te_conformance.suites.adapters.base import Adapter
from te_conformance.suites.cases import DTYPES, AttnCase

# tiny tensors, one thread (suites/plugin.py); every case is about dropout (suites/features.py)
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.feature("dropout")]


B, H, SQ, SKV, D = 2, 2, 24, 48, 8
LAYOUT = "bshd_bshd_bshd"
DEVICE_AXIS = devices.device_params()




def _case(device_name: str, mask_type: str = "no_mask") -> AttnCase:
    return AttnCase(LAYOUT, "fp32", mask_type, device=device_name, b=B, sq=SQ, skv=SKV, h=H,
                    hg=H, d=D, dv=SKV)  # fmt: skip


def _ready(adapter: Adapter, capability: str, case: AttnCase, **fields) -> torch.device:
    """Record the case; skip, with the reason, unless the adapter can run it here."""
    record.case(impl=adapter.name, layout=case.layout, dtype=case.dtype, mask_type=case.mask_type,
                device=case.device, **fields)  # fmt: skip
    return ready(adapter, None, capability, device=case.device)


def _inputs(device, seed: int = 0, grad: bool = False):
    """q, k small (every probability well above 0), v = identity over key positions."""
    gen = torch.Generator().manual_seed(seed)
    q = (0.5 * torch.randn(B, SQ, H, D, generator=gen)).to(device)
    k = (0.5 * torch.randn(B, SKV, H, D, generator=gen)).to(device)
    v = torch.eye(SKV).view(1, SKV, 1, SKV).expand(B, SKV, H, SKV).contiguous().to(device)
    dout = torch.randn(B, SQ, H * SKV, generator=gen).to(device)
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v, dout


def _call(adapter, module, case, q, k, v):
    kwargs = dict(qkv_layout=case.layout, attn_mask_type=case.mask_type)
    return adapter.call(module, case, q, k, v, kwargs)[0]


def _probs(out: torch.Tensor) -> torch.Tensor:
    """bshd output [b, sq, h * skv] with v = I -> probabilities (b, h, sq, skv), float64."""
    return out.detach().double().view(B, SQ, H, SKV).permute(0, 2, 1, 3)


# ----------------------------------------------------------------------------- statistics


@pytest.mark.per_adapter(p=(0.2, 0.6), device_name=DEVICE_AXIS)
def test_dropout_drops_probabilities(adapter, p, device_name):
    """Training mode: the fraction of dropped probabilities is p within 6 binomial standard
    deviations of its count; every kept probability is the no-dropout one times 1/(1-p); the
    total mass E[out] stays the no-dropout one (within 6 standard deviations of its own
    variance, p/(1-p) * sum P^2)."""
    case = _case(device_name)
    device = _ready(adapter, "dropout", case, dropout=p)
    q, k, v, _ = _inputs(device)
    plain = _probs(_call(adapter, adapter.build(case, D**-0.5, dropout=0.0), case, q, k, v))
    assert plain.min() > 1e-4, "precondition: every probability well above 0"
    dropped = _probs(_call(adapter, adapter.build(case, D**-0.5, dropout=p).train(), case, q, k, v))

    zero = dropped == 0
    n = zero.numel()
    fraction = zero.double().mean().item()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(fraction - p) < 6 * sigma, (
        f"dropped fraction {fraction:.4f} of {n} probabilities, expected {p} +- {6 * sigma:.4f}"
    )
    kept = ~zero
    scaled = plain[kept] / (1 - p)
    worst = ((dropped[kept] - scaled).abs() / scaled).max().item()
    assert worst < 1e-5, f"kept probabilities are not P / (1 - p): worst relative error {worst}"
    excess = (dropped - plain).sum().item()  # sum over rows of (row mass - 1)
    sd = (p / (1 - p) * (plain**2).sum().item()) ** 0.5
    assert abs(excess) < 6 * sd, f"E[out] not preserved: total excess {excess:.4f}, sd {sd:.4f}"


@pytest.mark.per_adapter(device_name=DEVICE_AXIS)
def test_dropout_masks_are_fresh_and_independent(adapter, device_name):
    """Each training step draws a new mask, and each head and batch element its own: the share
    of positions dropped in both of two masks is p^2 (within 6 binomial standard deviations),
    where one mask reused across steps, or shared by the heads or the batch, gives p."""
    p = 0.5
    case = _case(device_name)
    device = _ready(adapter, "dropout", case, dropout=p)
    q, k, v, _ = _inputs(device)
    module = adapter.build(case, D**-0.5, dropout=p).train()
    first, second = (_probs(_call(adapter, module, case, q, k, v)) == 0 for _ in range(2))
    pairs = {
        "two consecutive steps": (first, second),
        "heads 0 and 1 of one step": (first[:, 0], first[:, 1]),
        "batch elements 0 and 1 of one step": (first[0], first[1]),
    }
    for what, (a, b) in pairs.items():
        n = a.numel()
        both = (a & b).double().mean().item()
        sigma = (p * p * (1 - p * p) / n) ** 0.5
        assert abs(both - p * p) < 6 * sigma, (
            f"{what}: {both:.4f} of {n} positions dropped in both masks, expected p^2 = "
            f"{p * p} +- {6 * sigma:.4f} for independent masks (p = {p}: the same mask gives p)"
        )


@pytest.mark.per_adapter(dtype=("bf16", "fp16"), device_name=DEVICE_AXIS)
def test_dropout_values_in_low_precision(adapter, dtype, device_name):
    """bf16 and fp16: every kept probability is the no-dropout one times 1/(1-p) within 4 ulps
    of the dtype (the output's rounding and the scale's), and the dropped fraction is p within
    6 binomial standard deviations. The fp32 test above judges values in fp32 alone; a scale
    applied wrongly in low precision (E[out] of 0.7) passed it."""
    p = 0.2
    case = replace(_case(device_name), dtype=dtype)
    device = _ready(adapter, "dropout", case, dropout=p)
    skips.unless("declined", adapter.declines(case, ("dropout",), case.device))
    low = DTYPES[dtype]
    q, k, v, _ = (t.to(low) for t in _inputs(device))
    plain = _probs(_call(adapter, adapter.build(case, D**-0.5, dropout=0.0), case, q, k, v))
    assert plain.min() > 1e-3, "precondition: every probability well above 0"
    dropped = _probs(_call(adapter, adapter.build(case, D**-0.5, dropout=p).train(), case, q, k, v))
    zero = dropped == 0
    fraction = zero.double().mean().item()
    sigma = (p * (1 - p) / zero.numel()) ** 0.5
    assert abs(fraction - p) < 6 * sigma, (
        f"dropped fraction {fraction:.4f}, expected {p} +- {6 * sigma:.4f}"
    )
    scaled = plain[~zero] / (1 - p)
    worst = ((dropped[~zero] - scaled).abs() / scaled).max().item()
    tolerance = 4 * torch.finfo(low).eps
    assert worst <= tolerance, (
        f"{dtype}: kept probabilities are not P / (1 - p): worst relative error {worst:.3g} "
        f"(allowed {tolerance:.3g}, 4 ulps)"
    )


# ----------------------------------------------------------------------------- identity


def _forward_backward(adapter, module, case, device):
    q, k, v, dout = _inputs(device, seed=1, grad=True)
    v = (torch.randn(v.shape, generator=torch.Generator().manual_seed(2)).to(device)
         .requires_grad_())  # fmt: skip
    out = _call(adapter, module, case, q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    return (out.detach(), *grads)


@pytest.mark.per_adapter(device_name=DEVICE_AXIS)
def test_dropout_off_is_exact_identity(adapter, device_name):
    """attention_dropout=0.3 in eval mode, and attention_dropout=0 in training mode, give the
    bytes of the no-dropout module (output, dq, dk, dv): dropout is off, not merely unbiased."""
    case = _case(device_name, "causal")
    device = _ready(adapter, "dropout", case)
    names = ("out", "dq", "dk", "dv")
    want = _forward_backward(adapter, adapter.build(case, D**-0.5).eval(), case, device)
    for what, module in (
        ("p = 0.3 in eval mode", adapter.build(case, D**-0.5, dropout=0.3).eval()),
        ("p = 0 in training mode", adapter.build(case, D**-0.5, dropout=0.0).train()),
    ):
        got = _forward_backward(adapter, module, case, device)
        differ = [n for n, a, b in zip(names, got, want) if not torch.equal(a, b)]
        assert not differ, f"{what}: {differ} differ from the no-dropout module's"


# ----------------------------------------------------------------------------- backward mask


@pytest.mark.per_adapter(device_name=DEVICE_AXIS)
def test_dropout_backward_uses_forward_mask(adapter, device_name):
    """One training call: the dropped probabilities P_d are read off its output (v = I), the
    undropped P from a no-dropout call, and its mask M from where P_d is 0. Its gradients must be
    those of that very mask, in float64:
    dv = P_d^T dO; dP = (dO v^T) * M / (1-p); dS = P * (dP - rowsum(P * dP));
    dq = scale * dS k; dk = scale * dS^T q.
    A backward that redraws the mask, or forgets dropout, gives other dq, dk and dv."""
    p = 0.3
    case = _case(device_name)
    device = _ready(adapter, "dropout", case, dropout=p)
    scale = D**-0.5
    q, k, v, dout = _inputs(device, seed=3, grad=True)
    out = _call(adapter, adapter.build(case, scale, dropout=p).train(), case, q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    with torch.no_grad():
        plain = _probs(_call(adapter, adapter.build(case, scale), case, q, k, v))  # P
    assert plain.min() > 1e-4, "precondition: every probability well above 0"

    dropped = _probs(out)  # P_d (b, h, sq, skv)
    keep = (dropped != 0).double()
    assert 0 < keep.mean().item() < 1, "precondition: the call dropped some, not all"
    do = dout.double().view(B, SQ, H, SKV).permute(0, 2, 1, 3)  # (b, h, sq, dv)
    qh, kh = (t.detach().double().permute(0, 2, 1, 3) for t in (q, k))  # (b, h, s, d)
    dp = do * keep / (1 - p)  # v = I: dO v^T = dO
    ds = plain * (dp - (plain * dp).sum(-1, keepdim=True))
    want = {
        "dv": (dropped.transpose(-2, -1) @ do).permute(0, 2, 1, 3),  # (b, skv, h, dv)
        "dq": (scale * ds @ kh).permute(0, 2, 1, 3),  # (b, sq, h, d)
        "dk": (scale * ds.transpose(-2, -1) @ qh).permute(0, 2, 1, 3),  # (b, skv, h, d)
    }
    for name, got in (("dv", dv), ("dq", dq), ("dk", dk)):
        err = (got.double() - want[name]).abs().max().item()
        size = want[name].abs().max().item()
        assert err <= 1e-4 * size, (
            f"{name} is not the gradient of the forward's dropout mask: max error {err:.3g} "
            f"(largest entry {size:.3g})"
        )


# ----------------------------------------------------------------------------- the context


class RngTracker:
    """A stand-in for an RNG state tracker (Megatron's, TE's): ``fork`` is the context a module
    gets as ``attention_dropout_ctx``. Inside it the default generators (CPU and the device's)
    are forked and seeded with the tracker's seed, and restored on exit; entries and exits are
    counted, and ``inside`` tells whether the context is open."""

    def __init__(self, seed: int, device: torch.device):
        self.seed, self.device = seed, device
        self.entered = self.exited = 0
        self.inside = False

    @contextlib.contextmanager
    def fork(self):
        self.entered += 1
        self.inside = True
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(self.seed)
                yield
        finally:
            self.inside = False
            self.exited += 1


def _rng_state(device):
    state = [torch.get_rng_state()]
    if device.type == "cuda":
        state.append(torch.cuda.get_rng_state(device))
    return state


@pytest.mark.per_adapter(device_name=DEVICE_AXIS)
def test_dropout_runs_in_attention_dropout_ctx(adapter, device_name):
    """A training forward enters the module's attention_dropout_ctx (and leaves it: no context
    open afterwards) and draws its dropout mask inside it: the tracker's seed alone decides the
    mask (two global seeds, one tracker seed: the same bytes; another tracker seed: another
    mask), and the default generator outside is not advanced by the call."""
    p = 0.3
    case = _case(device_name)
    device = _ready(adapter, "dropout_ctx", case, dropout=p)
    q, k, v, _ = _inputs(device, seed=4)

    def run(tracker_seed: int, global_seed: int):
        tracker = RngTracker(tracker_seed, device)
        module = adapter.build(case, D**-0.5, dropout=p, dropout_ctx=tracker.fork).train()
        torch.manual_seed(global_seed)
        before = _rng_state(device)
        out = _call(adapter, module, case, q, k, v)
        after = _rng_state(device)
        assert tracker.entered >= 1, "the training forward never entered attention_dropout_ctx"
        assert tracker.exited == tracker.entered and not tracker.inside, (
            f"attention_dropout_ctx entered {tracker.entered} times, left {tracker.exited}"
        )
        assert all(torch.equal(a, b) for a, b in zip(before, after)), (
            "the call advanced the default generator: dropout drew outside attention_dropout_ctx"
        )
        return out

    first = run(11, 100)
    assert (first == 0).any(), "precondition: dropout dropped something"
    assert torch.equal(first, run(11, 200)), (
        "another global seed changed the mask: dropout did not draw from the context's generator"
    )
    assert not torch.equal(first, run(12, 100)), "another tracker seed gave the same mask"
