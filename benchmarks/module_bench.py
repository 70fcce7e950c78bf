"""Module sections: UnfusedDotProductAttention at the training and a small shape, in a stack;
the unfused rooflines (GEMMs alone + the other must-move bytes at the run's ceilings, with all
GEMM tiles or only those a causal mask keeps) at the training shape."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks import checks, peers
from benchmarks.cases import DTYPES, AttnShape
from benchmarks.roofline import (
    CEILING_MIX,
    DIRECTIONS,
    Traffic,
    kept_tile_fraction,
    ms_at,
    roofline_ms,
    softmax_traffic,
)
from benchmarks.runner import Runner, base_row, is_fatal
from benchmarks.timing import paired_wall, sync, time_calls, wall_per_iteration

MASKS = ("causal", "padding")


# ----------------------------------------------------------------------------- inputs


@dataclass
class AttnInputs:
    """bshd q/k/v (requires grad), the output gradient and the mask in each API's terms."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor  # (b, s, h*d); 0 on padded query rows (a loss ignores them)
    causal: bool
    te_kwargs: dict  # te_fast forward keywords
    masked: torch.Tensor  # composite: True = masked out; causal (s, s), padding (b, 1, 1, s)
    keep: torch.Tensor | None  # SDPA attn_mask: True = attend; None with is_causal
    valid0: int  # valid query rows of batch element 0 (the checked one)


def make_inputs(shape: AttnShape, dtype: str, mask: str, device: torch.device) -> AttnInputs:
    b, h, s, d = shape.b, shape.h, shape.s, shape.d
    torch.manual_seed(zlib.crc32(f"{shape}/{dtype}/{mask}".encode()))
    q, k, v = (
        torch.randn(b, s, h, d, device=device, dtype=DTYPES[dtype]).requires_grad_()
        for _ in range(3)
    )
    do = torch.randn(b, s, h * d, device=device, dtype=DTYPES[dtype])
    if mask == "causal":
        kwargs = {"qkv_layout": "bshd_bshd_bshd", "attn_mask_type": "causal"}
        masked = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)  # (s, s)
        return AttnInputs(q, k, v, do, True, kwargs, masked, None, s)
    gen = torch.Generator().manual_seed(s)
    lengths = torch.randint(s // 2, s + 1, (b,), generator=gen)  # padding: 25% on average
    cu = torch.zeros(b + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    cu = cu.to(device)
    valid = torch.arange(s).view(1, s) < lengths.view(b, 1)  # (b, s) on the host
    valid = valid.to(device)
    do = do * valid.view(b, s, 1).to(do.dtype)
    kwargs = {
        "qkv_layout": "bshd_bshd_bshd",
        "attn_mask_type": "padding",
        "cu_seqlens_q": cu,
        "cu_seqlens_kv": cu,
    }
    keep = valid.view(b, 1, 1, s)
    # The composites mask padded keys only: their padded query rows hold values a loss ignores
    # (te_fast writes 0 there); those rows are not compared.
    return AttnInputs(q, k, v, do, False, kwargs, ~keep, keep, int(lengths[0]))


def reference(inp: AttnInputs, scale: float):
    """float64 SDPA (math backend) on batch element 0: (out, (dq, dk, dv))."""
    q0, k0, v0 = (t[:1].detach().double().requires_grad_() for t in (inp.q, inp.k, inp.v))
    keep0 = inp.keep[:1] if inp.keep is not None else None
    with peers.sdpa_backend("math"):
        out = peers.sdpa_attention(q0, k0, v0, keep0, inp.causal, scale)
        grads = torch.autograd.grad(out, (q0, k0, v0), inp.do[:1].double())
    return out.detach(), grads


def check_attention(out, grads, ref, inp: AttnInputs, bound: float) -> checks.Check:
    ref_out, ref_grads = ref
    n = inp.valid0
    parts = {"out": checks.check(out[:1, :n], ref_out[:, :n], bound)}
    for name, g, rg in zip(("dq", "dk", "dv"), grads, ref_grads):
        parts[name] = checks.check(g[:1], rg, bound)
    return checks.combine(parts)


# ----------------------------------------------------------------------------- implementations


@dataclass
class Impl:
    """One implementation: build() returns f(*args) -> out (compiling lazily at first call)."""

    name: str
    build: Callable[[], Callable]
    mode: str | None = None  # None: eager; "default" / "reduce-overhead": torch.compile
    sdpa: str | None = None  # SDPA backend, restricted around each step
    optional: bool = False  # a backend that may not support the case: failure -> skipped


def attention_impls(inp: AttnInputs, scale: float, smoke: bool, mode: str, sdpa: bool):
    import te_fast

    te = te_fast.UnfusedDotProductAttention(softmax_scale=scale)
    kw = inp.te_kwargs

    def te_compiled():
        c = peers.compile(te, smoke=smoke, mode=None if mode == "default" else mode)
        return lambda q, k, v: c(q, k, v, **kw)

    def composite_compiled():
        c = peers.compile(
            peers.composite_attention, smoke=smoke, mode=None if mode == "default" else mode
        )
        return lambda q, k, v: c(q, k, v, inp.masked, scale)

    sdpa_fn = lambda q, k, v: peers.sdpa_attention(q, k, v, inp.keep, inp.causal, scale)
    tag = "compile" if mode == "default" else mode
    impls = [
        Impl("te_fast", lambda: lambda q, k, v: te(q, k, v, **kw)),
        Impl(f"te_fast.{tag}", te_compiled, mode=mode),
        Impl(
            "composite",
            lambda: lambda q, k, v: peers.composite_attention(q, k, v, inp.masked, scale),
        ),
        Impl(
            f"composite.{'inductor' if mode == 'default' else mode}", composite_compiled, mode=mode
        ),
    ]
    if sdpa:
        impls.append(Impl("sdpa.math", lambda: sdpa_fn, sdpa="math"))
        for backend in peers.SDPA_FUSED:
            impls.append(Impl(f"sdpa.{backend}", lambda: sdpa_fn, sdpa=backend, optional=True))
    return impls


# ----------------------------------------------------------------------------- measuring


def make_step(f, args: tuple, wrt: tuple, do: torch.Tensor, mode: str | None):
    """One forward + backward; returns (out, grads of wrt)."""

    def step():
        peers.mark_step(mode)
        out = f(*args)
        return out, torch.autograd.grad(out, wrt, do)

    return step


def peak_extra_bytes(step, device: torch.device) -> int | None:
    """Peak memory of one step above what was allocated before it (inputs, weights)."""
    if device.type != "cuda":
        return None
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


@dataclass
class Measure:
    """How one section times its steps."""

    reps: int
    warmup: int
    wall: bool = False  # also host wall-clock per iteration (launch-bound shapes); reported
    peak: bool = False


def measure(r: Runner, row: dict, impl: Impl, args, wrt, do, check_fn, how: Measure) -> None:
    ctx = peers.sdpa_backend(impl.sdpa) if impl.sdpa else contextlib.nullcontext()
    with r.guard(row), ctx:
        if impl.mode:
            peers.reset_compile_state()
        skips_before = peers.compile_counters()["cudagraph_skips"]
        step = make_step(impl.build(), args, wrt, do, impl.mode)
        try:
            if impl.mode:
                _, entry = r.first_call(f"{row['case']}", step)
                row["compile_s"] = entry["seconds"]
            else:
                step()
        except RuntimeError as exc:
            if not impl.optional or is_fatal(exc):
                raise
            r.skip(row, f"backend does not run this case: {str(exc).splitlines()[0][:120]}")
            return
        for _ in range(how.warmup):
            step()
        out, grads = step()  # after warm-up: a CUDA-graph replay under reduce-overhead
        chk = check_fn(out, grads)
        del out, grads
        stats = time_calls(step, r.device, how.reps, 0)
        row.update(median_ms=stats.median_ms, iqr_ms=stats.iqr_ms, reps=stats.n)
        if how.wall:
            wall = wall_per_iteration(step, r.device, how.reps)
            row.update(wall_ms=wall.median_ms, wall_iqr_ms=wall.iqr_ms)
        if how.peak:
            row["peak_extra_bytes"] = peak_extra_bytes(step, r.device)
        r.checked(row, chk)
        skipped = peers.compile_counters()["cudagraph_skips"] - skips_before
        if impl.mode == "reduce-overhead" and skipped and not r.plan.smoke:
            row.update(status="WRONG", note=f"{skipped} CUDA graph(s) skipped: not reduce-overhead")
        r.emit(row)


def summarize_group(r: Runner, rows: list[dict], metric: str) -> None:
    """speedup = eager composite's time / this row's time (same run, same config)."""
    ref = next((x for x in rows if x["impl"] == "composite" and metric in x), None)
    timed = [x for x in rows if metric in x and x["status"] not in ("ERROR", "skipped")]
    if ref is not None:
        for x in timed:
            x["speedup"] = ref[metric] / x[metric]
    fused = [x for x in timed if x["impl"].startswith("sdpa.") and x["impl"] != "sdpa.math"]
    if fused:
        best = min(fused, key=lambda x: x[metric])
        best["best_fused"] = True
    if not r.plan.smoke and ref is not None:
        text = ", ".join(f"{x['impl']} {x['speedup']:.2f}x" for x in timed)
        best_txt = f"; fastest fused SDPA: {best['impl']}" if fused else ""
        print(f"         speedup vs eager composite ({metric}): {text}{best_txt}", flush=True)


def add_paired(r: Runner, group: list[dict], te_step, composite_step) -> None:
    """te_fast's eager row gets its wall time paired round by round with the eager composite's
    (timing.paired_wall: median ratio te_fast / composite and quartiles): the figure the
    small-shape and stack targets are decided on, since these host-bound rows, each timed in its
    own stretch, swing by 20% and more from run to run on the H200 machine."""
    rows = {x["impl"]: x for x in group}
    te, comp = rows.get("te_fast"), rows.get("composite")
    if te is None or comp is None or te["status"] != "ok" or comp["status"] != "ok":
        return
    p = paired_wall(te_step, composite_step, r.device, rounds=2 if r.plan.smoke else 20)
    te.update(paired_ratio=p.ratio, paired_q1=p.q1, paired_q3=p.q3, paired_rounds=p.rounds)
    if not r.plan.smoke:
        print(
            f"         paired wall te_fast / composite (eager): {p.ratio:.3f} "
            f"(quartiles {p.q1:.3f}-{p.q3:.3f}, {p.rounds} rounds)",
            flush=True,
        )


# ----------------------------------------------------------------------------- the unfused roofline

ROOFLINE_CONFIGS = ("causal", "padding", "thd")  # thd: the padding batch packed, thd_thd_thd
# Kernel-name fragments of a CUDA profile, by the roofline's terms (first match wins).
PROFILE_TERMS = (
    ("convert", ("thd_to_bshd", "bshd_to_thd")),
    ("softmax", ("softmax",)),
    ("gemm", ("gemm", "xmma", "nvjet", "cutlass", "cublas", "s16816", "s1688")),
)


# The softmax each config's roofline counts (roofline.MASKINGS): causal, te_fast's top-left op
# on square scores; padding and thd full rows and no mask bytes (their kept keys depend on each
# sequence's length, which an unfused kernel may take instead of a mask).
ROOFLINE_MASKING = {"causal": "upper_triang", "padding": "none", "thd": "none"}


def softmax_traffic_of(shape: AttnShape, elem: int, masking: str) -> tuple[Traffic, ...]:
    """The softmax forward's and backward's must-move bytes on the [b*h, s, s] scores."""
    scores = (shape.b * shape.h, shape.s, shape.s)
    return tuple(softmax_traffic(masking, d, scores, elem) for d in DIRECTIONS)


def roofline_bytes(shape: AttnShape, elem: int, tokens: int | None, masking: str) -> dict[str, int]:
    """Bytes an unfused attention's forward + backward must move outside its GEMMs, with
    n = b*h*s*s scores and a token row of R = h*d*elem bytes:
    - softmax (softmax_traffic_of, the config's masking): forward reads the kept scores and
      writes all of P, backward reads the kept dP and P and writes all of dS;
      softmax_full_row_bytes is the count before, 2*n*elem + 3*n*elem;
    - tokens (THD, t tokens padded to b*s rows; None for bshd: no conversion): thd->bshd reads t
      rows and writes b*s, bshd->thd reads t and writes t (the convert section's counts).
      Forward: q, k, v to bshd, out back to thd: 3*(t + b*s)*R + 2*t*R; backward: dout to bshd,
      dq, dk, dv back: (t + b*s)*R + 3*2*t*R."""
    b, h, s, d = shape.b, shape.h, shape.s, shape.d
    fwd, bwd = softmax_traffic_of(shape, elem, masking)
    out = {
        "softmax_fwd_bytes": fwd.must_move_bytes,
        "softmax_bwd_bytes": bwd.must_move_bytes,
        "softmax_full_row_bytes": fwd.full_row_bytes + bwd.full_row_bytes,
    }
    if tokens is None:
        out.update(convert_fwd_bytes=0, convert_bwd_bytes=0)
    else:
        row = h * d * elem
        to_bshd, to_thd = (tokens + b * s) * row, 2 * tokens * row
        out.update(convert_fwd_bytes=3 * to_bshd + to_thd, convert_bwd_bytes=to_bshd + 3 * to_thd)
    return out


def roofline(
    gemm_ms: float,
    softmax: tuple[Traffic, ...],
    convert_bytes: int,
    ceilings: dict[str, float],
    kept_tiles: float,
) -> dict[str, float]:
    """Two lower bounds of an unfused forward + backward, ms, from the six GEMMs' time alone
    (gemm_ms), the softmax's must-move bytes at the ceilings of their read:write mix
    (roofline.roofline_ms: copy for the full-row forward, add for the full-row backward, copy
    and fill for causal rows) and the conversions' bytes at the copy ceiling (ceilings: GB/s of
    bytes read + written, ops_bench.run_ceiling):
    - bound_ms, full GEMMs: gemm_ms + softmax_ms + convert_ms;
    - tile_bound_ms, tile skipping: gemm_ms * kept_tiles + softmax_ms + convert_ms, kept_tiles
      the share of 128x128 score tiles holding a kept element (each of the six GEMMs reads or
      writes the scores, so a kernel that skips masked tiles skips that share of its flops)."""
    softmax_ms = sum(roofline_ms(t.read_bytes, t.write_bytes, ceilings)[0] for t in softmax)
    convert_ms = ms_at(convert_bytes, ceilings["copy"])
    return {
        "gemm_ms": gemm_ms,
        "softmax_ms": softmax_ms,
        "convert_ms": convert_ms,
        "bound_ms": gemm_ms + softmax_ms + convert_ms,
        "kept_tile_fraction": kept_tiles,
        "tile_bound_ms": gemm_ms * kept_tiles + softmax_ms + convert_ms,
    }


def gemm_flops(shape: AttnShape) -> int:
    """Six GEMMs, each b*h batches of s*s*d multiply-adds (2 flops each)."""
    return 6 * 2 * shape.b * shape.h * shape.s * shape.s * shape.d


def unfused_gemms(shape: AttnShape, dtype: str, device: torch.device, scale: float):
    """One forward + backward's GEMMs as an unfused attention does them, on heads-first
    contiguous [b*h, s, d] operands (cuBLAS's best case): BMM1 S = scale * Q K^T (baddbmm,
    beta 0), BMM2 O = P V; dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q. One scores-sized
    operand stands for P and dS, one output for S and dP (the same shapes and layouts)."""
    bh, s, d = shape.b * shape.h, shape.s, shape.d
    td = DTYPES[dtype]
    torch.manual_seed(11)
    q, k, v, do = (torch.randn(bh, s, d, device=device, dtype=td) for _ in range(4))
    p = torch.rand(bh, s, s, device=device, dtype=td).mul_(2.0 / s)  # P-like, rows sum ~1
    scores = torch.empty(bh, s, s, device=device, dtype=td)
    o, dq, dk, dv = (torch.empty(bh, s, d, device=device, dtype=td) for _ in range(4))

    def step():
        scores.baddbmm_(q, k.transpose(1, 2), beta=0.0, alpha=scale)  # BMM1
        torch.bmm(p, v, out=o)  # BMM2
        torch.bmm(p.transpose(1, 2), do, out=dv)
        torch.bmm(do, v.transpose(1, 2), out=scores)  # dP
        torch.bmm(p, k, out=dq)  # dS K
        torch.bmm(p.transpose(1, 2), q, out=dk)  # dS^T Q

    def check() -> checks.Check:
        """The six outputs are what a float64 matmul makes of the same operands (batch 0)."""
        step()
        q0, k0, v0, do0, p0 = (t[0].double() for t in (q, k, v, do, p))
        refs = {
            "dP": (scores[0], do0 @ v0.T),
            "O": (o[0], p0 @ v0),
            "dV": (dv[0], p0.T @ do0),
            "dQ": (dq[0], p0 @ k0),
            "dK": (dk[0], p0.T @ q0),
        }
        bound = checks.MODULE_BOUND[td]
        return checks.combine(
            {name: checks.check(x[None], ref[None], bound) for name, (x, ref) in refs.items()}
        )

    return step, check


def profile_terms(step, device: torch.device) -> dict[str, float] | None:
    """Device time of one step's kernels by the roofline's terms (PROFILE_TERMS; "other" the rest),
    ms, from torch.profiler: where te_fast spends its step beside the bound. None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    step()
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync(device)
    terms = {"gemm": 0.0, "softmax": 0.0, "convert": 0.0, "other": 0.0}
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name.lower()
        term = next((t for t, keys in PROFILE_TERMS if any(k in name for k in keys)), "other")
        terms[term] += ev.device_time_total / 1e3  # us -> ms
    return terms


def thd_inputs(inp: AttnInputs, shape: AttnShape):
    """The padding batch packed: (q, k, v leaves (t, h, d), dout (t, h*d), te_fast keywords)."""
    b, s = shape.b, shape.s
    valid = inp.keep.view(b, s)
    q, k, v = (t.detach()[valid].requires_grad_() for t in (inp.q, inp.k, inp.v))
    do = inp.do[valid]  # (t, h*d)
    kw = dict(inp.te_kwargs, qkv_layout="thd_thd_thd", max_seqlen_q=s, max_seqlen_kv=s)
    return q, k, v, do, kw


def check_thd(out, grads, ref, inp: AttnInputs, bound: float) -> checks.Check:
    """Batch element 0 is the first valid0 tokens of the packed tensors."""
    ref_out, ref_grads = ref
    n = inp.valid0
    parts = {"out": checks.check(out[None, :n], ref_out[:, :n], bound)}
    for name, g, rg in zip(("dq", "dk", "dv"), grads, ref_grads):
        parts[name] = checks.check(g[None, :n], rg[:, :n], bound)
    return checks.combine(parts)


def run_thd(r: Runner, shape: AttnShape, dtype: str, how: Measure) -> dict:
    """te_fast eager at the THD shape: the padding config's batch in thd_thd_thd."""
    import te_fast

    inp = make_inputs(shape, dtype, "padding", r.device)
    ref = reference(inp, shape.d**-0.5)
    q, k, v, do, kw = thd_inputs(inp, shape)
    tokens = q.shape[0]
    te = te_fast.UnfusedDotProductAttention(softmax_scale=shape.d**-0.5)
    bound = checks.MODULE_BOUND[DTYPES[dtype]]
    impl = Impl("te_fast", lambda: lambda q, k, v: te(q, k, v, **kw))
    row = base_row("module", "te_fast", config="thd", dtype=dtype, shape=f"{shape} thd t={tokens}")
    row["tokens"] = tokens
    check_fn = lambda out, grads: check_thd(out, grads, ref, inp, bound)
    measure(r, row, impl, (q, k, v), (q, k, v), do, check_fn, how)
    add_profile(r, row, make_step(impl.build(), (q, k, v), (q, k, v), do, None))
    return row


def add_profile(r: Runner, row: dict, step) -> None:
    """row["profile_ms"]: its step's kernel time by term (profile_terms), where the row is ok. A
    profiler that fails here (no CUPTI) is said loudly and leaves the row as it is."""
    if row.get("status") != "ok":
        return
    try:
        terms = profile_terms(step, r.device)
    except Exception as exc:  # noqa: BLE001 - the timing stands without its profile
        print(f"!!! no profile for {row['case']}: {type(exc).__name__}: {exc}", flush=True)
        row["profile_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return
    if terms is not None:
        row["profile_ms"] = terms


def run_roofline(r: Runner, dtype: str, te_rows: dict[str, dict[str, dict]]) -> None:
    """One roofline row per config (module/<config>/<dtype>/roofline): the GEMMs alone, timed
    once per dtype (the three configs run the same GEMMs), plus the softmax and conversion bytes
    at the ceilings of this run (roofline()); te_fast's rows of the config get x_roofline = their
    time / bound_ms and x_tile_bound = their time / tile_bound_ms, and the roofline row the eager
    one's, with the gap to bound_ms by term where te_fast's step was profiled (profile_ms)."""
    shape = r.plan.module_shape
    shape_txt = f"{shape} [b*h,s,d]"
    head = base_row("module", "roofline", config="gemms", dtype=dtype, shape=shape_txt)
    if not CEILING_MIX.keys() <= r.ceilings.keys():
        r.skip(head, "no ceilings in this run")
        return
    gemm = None
    with r.guard(head):
        step, check = unfused_gemms(shape, dtype, r.device, shape.d**-0.5)
        chk = check()
        gemm = time_calls(step, r.device, max(r.plan.reps, 3), r.plan.warmup)
        if not chk.ok:
            r.emit(r.checked(dict(head), chk))
            return
        del step
    if r.device.type == "cuda":
        torch.cuda.empty_cache()
    if gemm is None:
        return
    elem = torch.empty((), dtype=DTYPES[dtype]).element_size()
    for config in ROOFLINE_CONFIGS:
        impls = te_rows.get(config, {})
        ours = impls.get("te_fast")
        tokens = None
        if config == "thd":
            tokens = (ours or {}).get("tokens")
            if tokens is None:
                r.skip(base_row("module", "roofline", config=config, dtype=dtype), "no thd run")
                continue
        row = base_row("module", "roofline", config=config, dtype=dtype, shape=shape_txt)
        masking = ROOFLINE_MASKING[config]
        nbytes = roofline_bytes(shape, elem, tokens, masking)
        terms = roofline(
            gemm.median_ms,
            softmax_traffic_of(shape, elem, masking),
            nbytes["convert_fwd_bytes"] + nbytes["convert_bwd_bytes"],
            r.ceilings,
            kept_tile_fraction(masking, shape.s, shape.s),
        )
        row.update(nbytes)
        row.update(terms)
        row.update(
            gemm_iqr_ms=gemm.iqr_ms,
            gemm_reps=gemm.n,
            gemm_tflops=gemm_flops(shape) / (gemm.median_ms * 1e-3) / 1e12,
            ceiling_gbps=r.ceiling_gbps,
            tokens=tokens,
        )
        for x in impls.values():
            if x.get("status") == "ok" and "median_ms" in x:
                x["x_roofline"] = x["median_ms"] / terms["bound_ms"]
                x["x_tile_bound"] = x["median_ms"] / terms["tile_bound_ms"]
        if ours is None or "x_roofline" not in ours:
            row["note"] = "te_fast has no time in this run"
        else:
            row.update(
                te_fast_ms=ours["median_ms"],
                x_roofline=ours["x_roofline"],
                x_tile_bound=ours["x_tile_bound"],
            )
            if ours.get("profile_ms"):
                row.update(gaps(ours["median_ms"], ours["profile_ms"], terms))
        r.emit(row)
        if not r.plan.smoke:
            print(f"         {describe_roofline(row)}", flush=True)


def gaps(te_ms: float, profile: dict[str, float], terms: dict[str, float]) -> dict:
    """te_fast's time minus the bound, by term: each profiled term less the bound's, the other
    kernels, and what no kernel covers (launch gaps, host waits: the median step less the
    profiled kernels). The terms sum to te_fast_ms - bound_ms."""
    gap = {t: profile[t] - terms[f"{t}_ms"] for t in ("gemm", "softmax", "convert")}
    gap["other_kernels"] = profile["other"]
    gap["no_kernel"] = te_ms - sum(profile.values())
    return {"gap_ms": gap, "largest_gap": max(gap, key=gap.get)}


def describe_roofline(row: dict) -> str:
    text = (
        f"roofline {row['config']}: GEMMs {row['gemm_ms']:.3f} + softmax {row['softmax_ms']:.3f}"
        f" + convert {row['convert_ms']:.3f} = {row['bound_ms']:.3f} ms; tile skipping "
        f"({100 * row['kept_tile_fraction']:.0f}% of tiles) {row['tile_bound_ms']:.3f} ms"
    )
    if "x_roofline" in row:
        text += (
            f"; te_fast {row['te_fast_ms']:.3f} ms = {row['x_roofline']:.2f}x, "
            f"{row['x_tile_bound']:.2f}x tile skipping"
        )
    if "largest_gap" in row:
        text += f"; largest gap: {row['largest_gap']} {row['gap_ms'][row['largest_gap']]:.3f} ms"
    return text


# ----------------------------------------------------------------------------- sections


def run_module(r: Runner) -> None:
    """Training shape, bf16/fp16 x causal/padding: fwd+bwd time (CUDA events), peak memory."""
    shape = r.plan.module_shape
    scale = shape.d**-0.5
    how = Measure(reps=r.plan.module_reps, warmup=2, peak=True)
    if not r.plan.module_dtypes():
        print("module: nothing to run (the training shape runs in bf16/fp16 only)", flush=True)
    for dtype in r.plan.module_dtypes():
        te_rows: dict[str, dict[str, dict]] = {}  # config -> impl -> row, for the roofline
        for mask in MASKS:
            group = []
            if r.expired():
                r.skip(base_row("module", "all", config=mask, dtype=dtype), "deadline passed")
                continue
            inp = make_inputs(shape, dtype, mask, r.device)
            ref = reference(inp, scale)
            bound = checks.MODULE_BOUND[DTYPES[dtype]]
            check_fn = lambda out, grads, inp=inp, ref=ref, bound=bound: check_attention(
                out, grads, ref, inp, bound
            )
            args = (inp.q, inp.k, inp.v)
            for impl in attention_impls(inp, scale, r.plan.smoke, "default", sdpa=True):
                row = base_row("module", impl.name, config=mask, dtype=dtype, shape=f"{shape} bshd")
                if impl.sdpa == "flash" and not inp.causal:
                    r.skip(row, "flash SDPA takes no attn_mask")
                    continue
                if r.device.type == "cuda":
                    torch.cuda.empty_cache()  # each impl starts from the same allocator state
                measure(r, row, impl, args, args, inp.do, check_fn, how)
                group.append(row)
                if impl.name == "te_fast":
                    add_profile(r, row, make_step(impl.build(), args, args, inp.do, None))
            summarize_group(r, group, "median_ms")
            te_rows[mask] = {x["impl"]: x for x in group if x["impl"].startswith("te_fast")}
            del inp, ref
            if r.device.type == "cuda":
                torch.cuda.empty_cache()
        if r.expired():
            r.skip(base_row("module", "roofline", config="all", dtype=dtype), "deadline passed")
            continue
        te_rows["thd"] = {"te_fast": run_thd(r, shape, dtype, how)}
        if r.device.type == "cuda":
            torch.cuda.empty_cache()
        run_roofline(r, dtype, te_rows)


def run_small(r: Runner) -> None:
    """Small causal shape: launch/CPU bound, so host wall-clock per iteration is reported."""
    shape = r.plan.small_shape
    dtype = r.plan.small_dtype()
    scale = shape.d**-0.5
    how = Measure(reps=r.plan.small_reps, warmup=r.plan.small_warmup, wall=True)
    if r.expired():
        r.skip(base_row("small", "all", config="causal", dtype=dtype), "deadline passed")
        return
    inp = make_inputs(shape, dtype, "causal", r.device)
    ref = reference(inp, scale)
    bound = checks.MODULE_BOUND[DTYPES[dtype]]
    check_fn = lambda out, grads: check_attention(out, grads, ref, inp, bound)
    args = (inp.q, inp.k, inp.v)
    group = []
    eager = {}
    for impl in attention_impls(inp, scale, r.plan.smoke, "reduce-overhead", sdpa=False):
        row = base_row("small", impl.name, config="causal", dtype=dtype, shape=str(shape))
        measure(r, row, impl, args, args, inp.do, check_fn, how)
        group.append(row)
        if impl.mode is None:
            eager[impl.name] = make_step(impl.build(), args, args, inp.do, None)
    summarize_group(r, group, "wall_ms")
    add_paired(r, group, eager["te_fast"], eager["composite"])


class Layer(torch.nn.Module):
    """A Linear projection producing q, k, v (bs3hd views), then causal attention."""

    def __init__(self, shape: AttnShape, use_te_fast: bool):
        super().__init__()
        import te_fast

        self.h, self.d = shape.h, shape.d
        self.qkv = torch.nn.Linear(shape.h * shape.d, 3 * shape.h * shape.d, bias=False)
        self.attn = te_fast.UnfusedDotProductAttention(shape.d**-0.5) if use_te_fast else None
        self.register_buffer("masked", torch.ones(shape.s, shape.s, dtype=torch.bool).triu(1))

    def forward(self, x):  # (b, s, h*d)
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, self.d).unbind(2)  # bs3hd: (b, s, h, d)
        if self.attn is not None:
            return self.attn(q, k, v, qkv_layout="bs3hd", attn_mask_type="causal")
        return peers.composite_attention(q, k, v, self.masked, self.d**-0.5)  # (b, s, h*d)


def make_stack(shape: AttnShape, layers: int, use_te_fast: bool, dtype, device):
    torch.manual_seed(8)  # the same weights for every variant
    stack = torch.nn.Sequential(*(Layer(shape, use_te_fast) for _ in range(layers)))
    return stack.to(device=device, dtype=dtype)


def run_stack(r: Runner) -> None:
    """A stack of Layer at the small shape, fwd+bwd of input and weights."""
    shape, n = r.plan.small_shape, r.plan.stack_layers
    dtype = r.plan.small_dtype()
    td = DTYPES[dtype]
    how = Measure(reps=r.plan.small_reps, warmup=r.plan.small_warmup, wall=True)
    if r.expired():
        r.skip(base_row("stack", "all", config=f"{n}x causal", dtype=dtype), "deadline passed")
        return
    torch.manual_seed(9)
    x = torch.randn(shape.b, shape.s, shape.h * shape.d, device=r.device, dtype=td)
    x.requires_grad_()
    do = torch.randn_like(x)
    ref_stack = make_stack(shape, n, False, torch.float64, r.device)
    x64 = x.detach().double().requires_grad_()
    ref_out = ref_stack(x64)
    ref_grads = torch.autograd.grad(ref_out, (x64, *ref_stack.parameters()), do.double())
    bound = 2 * checks.MODULE_BOUND[td]

    def check_fn(out, grads):
        parts = {"out": checks.check(out, ref_out, bound)}
        for i, (g, rg) in enumerate(zip(grads, ref_grads)):
            parts["dx" if i == 0 else f"dW{i - 1}"] = checks.check(g, rg, bound)
        return checks.combine(parts)

    group = []
    eager = {}
    for use_te, compiled in ((False, False), (False, True), (True, False), (True, True)):
        name = ("te_fast" if use_te else "composite") + (".reduce-overhead" if compiled else "")
        row = base_row(
            "stack", name, config=f"{n}x causal", dtype=dtype, shape=f"{n}x Linear+attn {shape}"
        )
        stack = make_stack(shape, n, use_te, td, r.device)
        mode = "reduce-overhead" if compiled else None
        if compiled:
            build = lambda s=stack, m=mode: peers.compile(s, smoke=r.plan.smoke, mode=m)
        else:
            build = lambda s=stack: s
            eager[name] = make_step(stack, (x,), (x, *stack.parameters()), do, None)
        impl = Impl(name, build, mode=mode)
        measure(r, row, impl, (x,), (x, *stack.parameters()), do, check_fn, how)
        group.append(row)
    summarize_group(r, group, "wall_ms")
    add_paired(r, group, eager["te_fast"], eager["composite"])
