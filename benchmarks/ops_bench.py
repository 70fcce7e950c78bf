"""Bandwidth sections: the ceilings, softmax ops and their peers, the layout conversions."""

from __future__ import annotations

import time

import torch

from benchmarks import checks, peers, te_peer
from benchmarks.cases import CAUSAL_OPS, DTYPES, SCALE, SOFTMAX_OPS, SoftmaxOp
from benchmarks.runner import Fatal, Runner, base_row
from benchmarks.softmax_case import SoftmaxCase
from benchmarks.timing import time_calls


def _ops():
    from te_fast import ops  # looked up per call so a test can swap an op for a broken one

    return ops


# ----------------------------------------------------------------------------- ceiling


def run_ceiling(r: Runner) -> None:
    """The ceiling kernels, one row each, on buffers of plan.ceiling_bytes; GB/s = bytes read +
    written a second, by read:write mix (roofline.CEILING_MIX):
    - copy: uint8 dst.copy_(src), 1 read : 1 write: the copy ceiling (fraction_of_ceiling 100%);
    - add: fp32 torch.add(a, b, out=c), 2 reads : 1 write;
    - fill: fp32 dst.fill_(1), 0 reads : 1 write.
    Each op row's roofline takes the pair whose mixes bracket its own (roofline.roofline_ms)."""
    n = r.plan.ceiling_bytes
    shape = f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n} B"
    for name, kernel in (("copy", _copy), ("add", _add), ("fill", _fill)):
        fn, correct, moved = kernel(n, r.device)  # the last kernel's buffers are freed here
        stats = time_calls(fn, r.device, r.plan.reps, r.plan.warmup)
        if not correct():
            raise Fatal(f"the {name} ceiling's kernel is wrong: nothing else can be trusted")
        r.ceilings[name] = moved / (stats.median_ms * 1e-3) / 1e9
        r.bandwidth(base_row("ceiling", name, shape=shape), stats, moved, None)


def _copy(n: int, device: torch.device):
    """(kernel, its check, bytes it moves) of a copy of n bytes."""
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src), lambda: torch.equal(dst, src), 2 * n


def _add(n: int, device: torch.device):
    """(kernel, its check, bytes it moves) of c = a + b on three fp32 buffers of n bytes."""
    a, b = (torch.empty(n // 4, device=device).uniform_() for _ in range(2))
    c = torch.empty_like(a)
    return lambda: torch.add(a, b, out=c), lambda: torch.equal(c, a + b), 3 * n


def _fill(n: int, device: torch.device):
    """(kernel, its check, bytes it moves) of a fill of an fp32 buffer of n bytes."""
    dst = torch.empty(n // 4, device=device)
    return lambda: dst.fill_(1.0), lambda: bool((dst == 1.0).all()), n


def te_fast_fwd(r: Runner, c: SoftmaxCase, op: SoftmaxOp) -> None:
    row = c.row(f"{op.fwd}_fwd", "te_fast")
    with r.guard(row):
        fn = getattr(_ops(), op.fwd)
        args = (c.x_for(op), c.mask, SCALE) if op.masking == "mask" else (c.x_for(op), SCALE)
        y = fn(*args)
        c.ys[op.name] = y
        chk = checks.check_fwd(c.as4(y), c.x, c.mask, op.masking, SCALE)
        stats = time_calls(lambda: fn(*args), r.device, r.plan.reps, r.plan.warmup)
        r.op_bandwidth(row, stats, c.traffic(op.masking, "fwd"), chk)


def te_fast_bwd(r: Runner, c: SoftmaxCase, op: SoftmaxOp) -> None:
    row = c.row(op.bwd, "te_fast")
    if op.name not in c.ys:
        r.skip(row, "no forward output (the forward failed)")
        return
    with r.guard(row):
        fn = getattr(_ops(), op.bwd)
        y = c.ys[op.name]
        dy = c.dy.view(y.shape)
        dx = fn(dy, y, SCALE)
        chk = checks.check_bwd(c.as4(dx), c.dy, c.as4(y), SCALE)
        del dx
        stats = time_calls(lambda: fn(dy, y, SCALE), r.device, r.plan.reps, r.plan.warmup)
        r.op_bandwidth(row, stats, c.traffic(op.masking, "bwd"), chk)


def torch_fwd(r: Runner, c: SoftmaxCase) -> None:
    row = c.row("softmax_fwd", "torch.softmax")
    with r.guard(row):
        fn = lambda: torch.softmax(c.x, -1)
        chk = checks.check_fwd(fn(), c.x, None, "none", 1.0)
        stats = time_calls(fn, r.device, r.plan.reps, r.plan.warmup)
        r.op_bandwidth(row, stats, c.traffic("none", "fwd"), chk)


def torch_bwd(r: Runner, c: SoftmaxCase) -> None:
    row = c.row("softmax_bwd", "torch.softmax")
    y = c.ys.get("scaled_softmax")
    if y is None:
        r.skip(row, "no forward output to differentiate")
        return
    with r.guard(row):
        fn = lambda: peers.torch_softmax_bwd(c.dy, y)
        chk = checks.check_bwd(fn(), c.dy, y, 1.0)
        stats = time_calls(fn, r.device, r.plan.reps, r.plan.warmup)
        r.op_bandwidth(row, stats, c.traffic("none", "bwd"), chk)


def triton_fwd(r: Runner, c: SoftmaxCase) -> None:
    row = c.row("softmax_fwd", "triton")
    with r.guard(row):
        softmax = peers.triton_softmax()
        t0 = time.perf_counter()
        y = softmax(c.x, SCALE)  # first call JIT-compiles for this BLOCK and dtype
        r.compiles.append(
            {"label": f"triton {c.dtype} sk={c.sk}", "seconds": round(time.perf_counter() - t0, 2)}
        )
        chk = checks.check_fwd(y, c.x, None, "none", SCALE)
        del y
        stats = time_calls(lambda: softmax(c.x, SCALE), r.device, r.plan.reps, r.plan.warmup)
        r.op_bandwidth(row, stats, c.traffic("none", "fwd"), chk)


class InductorPeers:
    """The inductor-compiled composites: static (one compile per shape) or dynamic (one per
    dtype and function); a budget on their total compile time keeps the run inside its window."""

    def __init__(self, r: Runner):
        self.r = r
        self.dynamic_cache: dict = {}

    def compiled(self, kind: str, dtype: str):
        fn = peers.softmax_masked if kind == "masked" else peers.softmax_plain
        if self.r.plan.inductor == "dynamic":
            key = (kind, dtype)
            if key not in self.dynamic_cache:
                self.dynamic_cache[key] = peers.compile(fn, smoke=self.r.plan.smoke, dynamic=True)
            return self.dynamic_cache[key]
        peers.reset_compile_state()
        return peers.compile(fn, smoke=self.r.plan.smoke)

    def run(self, c: SoftmaxCase, kind: str) -> None:
        r, plan = self.r, self.r.plan
        row = c.row("softmax_fwd" if kind == "plain" else "masked_softmax_fwd", "inductor")
        if plan.inductor == "off" or c.dtype not in plan.inductor_dtypes:
            return  # not asked for: no row
        if r.softmax_compile_s > plan.compile_budget_s:
            r.skip(row, f"inductor compile budget ({plan.compile_budget_s:.0f} s) spent")
            return
        with r.guard(row):
            fn = self.compiled(kind, c.dtype)
            args = (c.x, c.mask, SCALE) if kind == "masked" else (c.x, SCALE)
            y, entry = r.first_call(
                f"inductor {kind} softmax {c.dtype} sk={c.sk}",
                lambda: fn(*args),
                expect_compile=plan.inductor == "static",
            )
            r.softmax_compile_s += entry["seconds"]
            chk = checks.check_fwd(
                y,
                c.x,
                c.mask if kind == "masked" else None,
                "mask" if kind == "masked" else "none",
                SCALE,
            )
            del y
            stats = time_calls(lambda: fn(*args), r.device, plan.reps, plan.warmup)
            row["compile_s"] = entry["seconds"]
            traffic = c.traffic("mask" if kind == "masked" else "none", "fwd")
            r.op_bandwidth(row, stats, traffic, chk)


def run_softmax(r: Runner) -> None:
    """Every (dtype, sk) case: te_fast's four forwards, the peers, te_fast's backwards; then
    the square cases (run_square)."""
    plan = r.plan
    inductor = InductorPeers(r)
    for dtype in plan.dtypes:
        for sk in plan.sks:
            c = _case(r, dtype, sk, square=False)
            if c is None:
                continue
            for op in SOFTMAX_OPS:
                te_fast_fwd(r, c, op)
            if "torch" in plan.peers:
                torch_fwd(r, c)
            if "triton" in plan.peers:
                triton_fwd(r, c)
            if "inductor" in plan.peers:
                inductor.run(c, "plain")
                inductor.run(c, "masked")
            if "te" in plan.peers:
                te_peer.run_case(r, c, SOFTMAX_OPS)
            for op in SOFTMAX_OPS:
                te_fast_bwd(r, c, op)
            if "torch" in plan.peers:
                torch_bwd(r, c)
            del c
            if r.device.type == "cuda":
                torch.cuda.empty_cache()
    run_square(r)


def run_square(r: Runner) -> None:
    """The causal ops on square tensors ([b, h, s, s], s in plan.square_sks): te_fast and TE
    (peer "te") on the very same x and dy, forward then backward; rows .../square/... A
    --misaligned run has none (TE, their reason to be, has no misaligned rows)."""
    if r.plan.misaligned:
        return
    for dtype in r.plan.dtypes:
        for s in r.plan.square_sks:
            c = _case(r, dtype, s, square=True)
            if c is None:
                continue
            for op in CAUSAL_OPS:
                te_fast_fwd(r, c, op)
            if "te" in r.plan.peers:
                te_peer.run_case(r, c, CAUSAL_OPS)
            for op in CAUSAL_OPS:
                te_fast_bwd(r, c, op)
            del c
            if r.device.type == "cuda":
                torch.cuda.empty_cache()


def _case(r: Runner, dtype: str, sk: int, square: bool) -> SoftmaxCase | None:
    """The case's inputs, or None (a skip row past the deadline, an ERROR row if they fail)."""
    layout = {"config": "square"} if square else {}
    if r.expired():
        r.skip(base_row("softmax", "all", **layout, dtype=dtype, sk=sk), "deadline passed")
        return None
    c = None
    with r.guard(base_row("softmax", "inputs", **layout, dtype=dtype, sk=sk)):
        c = SoftmaxCase(r, dtype, sk, square)
    return c


# ----------------------------------------------------------------------------- conversions


def _ragged(r: Runner, dtype: str):
    b, h, s, d = (
        r.plan.convert_shape.b,
        r.plan.convert_shape.h,
        r.plan.convert_shape.s,
        r.plan.convert_shape.d,
    )
    gen = torch.Generator().manual_seed(2048)
    lengths = torch.randint(s // 2, s + 1, (b,), generator=gen)  # uniform in [s/2, s]
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    t = int(cu[-1])
    torch.manual_seed(t)
    thd = torch.randn(t, h, d, device=r.device, dtype=DTYPES[dtype])
    return thd, cu.to(r.device), lengths.tolist(), b, s


def run_convert(r: Runner) -> None:
    for dtype in r.plan.dtypes:
        if r.expired():
            r.skip(base_row("convert", "all", dtype=dtype), "deadline passed")
            continue
        convert_case(r, dtype)


def _exact(out: torch.Tensor, ref: torch.Tensor) -> checks.Check:
    """A conversion only moves data: bit equality (zero padding included) or WRONG."""
    same = torch.equal(out, ref)
    return checks.Check(same, 0.0 if same else float("inf"), 0.0)


def convert_case(r: Runner, dtype: str) -> None:
    thd, cu, lengths, b, s = _ragged(r, dtype)
    t, h, d = thd.shape
    ref_bshd = thd.new_zeros(b, s, h, d)
    start = 0
    for i, n in enumerate(lengths):
        ref_bshd[i, :n] = thd[start : start + n]
        start += n
    reps, warmup = r.plan.reps, r.plan.warmup

    shape = f"t={t} -> [{b},{s},{h},{d}]"
    row = base_row("convert", "te_fast", op="convert_thd_to_bshd", dtype=dtype, shape=shape)
    with r.guard(row):
        fn = lambda: _ops().convert_thd_to_bshd(thd, cu, b, s)
        chk = _exact(fn(), ref_bshd)
        stats = time_calls(fn, r.device, reps, warmup)
        r.bandwidth(row, stats, thd.nbytes + ref_bshd.nbytes, chk)  # read t rows, write b*s

    shape = f"[{b},{s},{h},{d}] -> t={t}"
    row = base_row("convert", "te_fast", op="convert_bshd_to_thd", dtype=dtype, shape=shape)
    with r.guard(row):
        fn = lambda: _ops().convert_bshd_to_thd(ref_bshd, cu, t)
        chk = _exact(fn(), thd)
        stats = time_calls(fn, r.device, reps, warmup)
        r.bandwidth(row, stats, 2 * thd.nbytes, chk)  # read the t valid rows, write t rows
