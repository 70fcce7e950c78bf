"""python -m benchmarks: te_fast's ops and module against their rooflines and their peers."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks import cases, peers, report
from benchmarks.cases import DTYPES, SECTIONS, SK_ALL, SOFTMAX_PEERS, SQUARE_SK, Plan
from benchmarks.runner import Fatal, Runner

L2_BYTES = 60 << 20  # at least the L2 of an H100/H200 (50 MB)

EPILOG = """\
examples:
  python -m benchmarks                                  the full run on one GPU (~4 min on an H200)
  python -m benchmarks --only softmax --dtypes bf16 --sk 128,2048 --reps 10
  python -m benchmarks --smoke --out /tmp/bench-smoke   CPU harness check (timings mean nothing)
  python -m benchmarks compare NEW.json OLD.json        flag ratios that fell by more than 10%
  python -m benchmarks targets latest.json              the performance issue's targets on one run
  python -m benchmarks readme [--check]                 README.md's performance section, made
                                                        from benchmarks/latest.json

exit codes: 0 ok; 1 a result is WRONG or a case raised (ERROR); 2 cannot run here
            (no CUDA, te_fast or triton unavailable); 3 a CUDA error or a harness
            crash stopped the run (what was measured is still written).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        default=None,
        help="folder for latest.json/.md/.png (default: benchmarks/out/; smoke: a temp dir)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny CPU matrix: does the harness run?")
    p.add_argument(
        "--misaligned",
        action="store_true",
        help="softmax inputs one element past an aligned address, so that te_fast takes its "
        "one-element (fallback) kernels; their rows are named .../misaligned/...",
    )
    p.add_argument("--only", default=",".join(SECTIONS), help=f"sections, from {SECTIONS}")
    p.add_argument("--dtypes", default="bf16,fp16,fp32", help="of bf16,fp16,fp32 (in this order)")
    p.add_argument("--sk", default=",".join(map(str, SK_ALL)), help="softmax row lengths")
    p.add_argument(
        "--square-sk",
        default=",".join(map(str, SQUARE_SK)),
        help="sizes s of the square [b, 16, s, s] causal cases (te_fast and TE on the same "
        'tensors); "" for none',
    )
    p.add_argument(
        "--reps",
        type=int,
        default=30,
        help="timed runs per op case (module: reps/3, small/stack: 4*reps)",
    )
    p.add_argument(
        "--numel",
        default="256M",
        help="elements per softmax case for 16-bit dtypes; fp32 gets half (default 256M)",
    )
    p.add_argument("--peers", default=",".join(SOFTMAX_PEERS), help="softmax peers to run")
    p.add_argument(
        "--inductor",
        choices=("static", "dynamic", "off"),
        default="static",
        help="softmax composites: one compile per shape (static), per dtype and "
        "function (dynamic), or none",
    )
    p.add_argument(
        "--inductor-dtypes",
        default="bf16",
        help="dtypes that get the inductor softmax peers (default bf16: 24 compiles; "
        "bf16,fp16 adds 24 more, ~35 s)",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=540.0,
        help="after this many seconds the remaining cases are skipped (loudly)",
    )
    p.add_argument(
        "--compile-budget-s",
        type=float,
        default=75.0,
        help="total compile time allowed to the inductor softmax peers",
    )
    return p


def plan_from_args(args: argparse.Namespace) -> Plan:
    plan = Plan(
        sections=cases.parse_list(args.only, SECTIONS, "--only"),
        dtypes=cases.parse_list(args.dtypes, DTYPES, "--dtypes"),
        sks=tuple(int(x) for x in args.sk.split(",") if x.strip()),
        square_sks=tuple(int(x) for x in args.square_sk.split(",") if x.strip()),
        numel16=cases.parse_count(args.numel),
        reps=args.reps,
        peers=cases.parse_list(args.peers, SOFTMAX_PEERS, "--peers") if args.peers else (),
        inductor=args.inductor,
        inductor_dtypes=cases.parse_list(args.inductor_dtypes, DTYPES, "--inductor-dtypes"),
        deadline_s=args.deadline_s,
        compile_budget_s=args.compile_budget_s,
        misaligned=args.misaligned,
    )
    if not plan.sks or any(sk < 1 for sk in plan.sks + plan.square_sks) or plan.reps < 1:
        raise ValueError("--sk and --square-sk need positive sizes and --reps a positive count")
    return cases.smoke_plan(plan) if args.smoke else plan


def preflight(plan: Plan) -> tuple[torch.device | None, str]:
    """The device, or None and why this machine cannot run the plan: fail before any timing."""
    import te_fast

    if plan.smoke:
        if te_fast.UNAVAILABLE_REASON:
            return None, f"te_fast is unavailable: {te_fast.UNAVAILABLE_REASON}"
        return torch.device("cpu"), ""
    if not torch.cuda.is_available():
        return None, "no CUDA device (use --smoke for the CPU harness check)"
    reason = te_fast.device_unavailable_reason("cuda")
    if reason:
        return None, f"te_fast has no CUDA kernels: {reason}"
    device = torch.device("cuda")
    if "softmax" in plan.sections and "triton" in plan.peers:
        try:
            softmax = peers.triton_softmax()
            x = torch.randn(3, 100, device=device, dtype=torch.bfloat16)
            err = (softmax(x, 0.5).float() - torch.softmax(x.float() * 0.5, -1)).abs().max()
            if not float(err) < 1e-2:
                return None, f"the triton peer is wrong on a tiny case (max err {float(err)})"
        except Exception as exc:  # noqa: BLE001
            return (
                None,
                f"the triton peer does not run ({type(exc).__name__}: {exc}); "
                "pass --peers torch,inductor to run without it",
            )
    return device, ""


def planned(plan: Plan) -> str:
    """What the run will do, with a rough H200 time estimate, printed before it starts."""
    est = cases.estimate(plan)
    counts = ", ".join(f"{k} {v}" for k, v in est["compiles"].items())
    return (
        f"plan: {','.join(plan.sections)}; dtypes {','.join(plan.dtypes)}; "
        f"{len(plan.sks)} row lengths, {len(plan.square_sks)} square sizes; reps {plan.reps}; "
        f"compiles planned: {counts} "
        f"(inductor softmax: {plan.inductor}, {','.join(plan.inductor_dtypes)}); rough H200 "
        f"estimate {est['seconds']:.0f} s {est['by_section']}; deadline {plan.deadline_s:.0f} s"
    )


def compile_summary(r: Runner) -> dict:
    def total(prefix):
        hits = [c for c in r.compiles if c["label"].startswith(prefix)]
        return {"count": len(hits), "seconds": round(sum(c["seconds"] for c in hits), 1)}

    return {
        "inductor_softmax": total("inductor"),
        "triton": total("triton"),
        "module": total("module/"),
        "small": total("small/"),
        "stack": total("stack/"),
    }


def result_of(r: Runner, env: dict, argv: list[str], sections_s: dict, state: str) -> dict:
    return {
        "schema": report.SCHEMA,
        "smoke": r.plan.smoke,
        "state": state,  # complete | partial (after each section) | stopped (CUDA error) | crashed
        "env": env,
        "command": "python -m benchmarks " + shlex.join(argv),
        "plan": asdict(r.plan),
        "ceiling_gbps": r.ceiling_gbps,  # the copy ceiling
        "ceilings_gbps": r.ceilings,  # copy, add (2 reads : 1 write), fill (0 : 1)
        "total_wall_s": round(r.elapsed(), 1),
        "estimate": cases.estimate(r.plan),
        "sections_s": sections_s,
        "compile_summary": compile_summary(r),
        "compiles": r.compiles,
        "problems": [row["case"] for row in r.problems()],
        "rows": r.rows,
    }


def _run_sections(r: Runner, steps, env: dict, argv: list[str], sections_s: dict, out: Path):
    for name, fn in steps:
        if name != "ceiling" and name not in r.plan.sections:
            continue
        t0 = time.perf_counter()
        fn(r)
        sections_s[name] = round(time.perf_counter() - t0, 1)
        if not r.plan.smoke:
            print(
                f"== {name} done in {sections_s[name]:.0f} s (total {r.elapsed():.0f} s)",
                flush=True,
            )
        report.write_json(result_of(r, env, argv, sections_s, "partial"), out)


def run(plan: Plan, device: torch.device, out: Path, argv: list[str]) -> int:
    from benchmarks import module_bench, ops_bench

    r = Runner(plan, device)
    env = report.environment(device)
    steps = [
        ("ceiling", ops_bench.run_ceiling),
        ("softmax", ops_bench.run_softmax),
        ("convert", ops_bench.run_convert),
        ("module", module_bench.run_module),
        ("small", module_bench.run_small),
        ("stack", module_bench.run_stack),
    ]
    sections_s: dict[str, float] = {}
    state, code = "complete", 0
    try:
        with peers.dynamo_settings():
            _run_sections(r, steps, env, argv, sections_s, out)
    except Fatal as exc:
        print(f"!!! STOPPED: {exc}", flush=True)
        print(f"!!! STOPPED: {exc}", file=sys.stderr, flush=True)
        state, code = "stopped", 3
    except Exception:  # noqa: BLE001 - a harness bug: say so, and keep what was measured
        traceback.print_exc()
        print("!!! CRASHED: the harness raised outside a case (traceback above)", flush=True)
        state, code = "crashed", 3
    result = result_of(r, env, argv, sections_s, state)
    paths = report.write_all(result, out)
    rc = _finish(r, result, paths)
    return code or rc


def _finish(r: Runner, result: dict, paths: list[Path]) -> int:
    problems = r.problems()
    skipped = [x for x in r.rows if x["status"] == "skipped" and "deadline" in x.get("note", "")]
    if r.plan.smoke:
        ran = sum(1 for x in r.rows if x["status"] == "ok")
        verdict = "harness OK" if not problems else f"harness FAILED ({len(problems)} problems)"
        print(f"smoke: {ran} cases ran, {verdict}; wrote {', '.join(map(str, paths))}", flush=True)
    else:
        est = result["estimate"]
        print(
            f"total wall time {result['total_wall_s']:.0f} s (estimated {est['seconds']} s); "
            f"sections {result['sections_s']} (estimated {est['by_section']})"
        )
        print(f"compiles: {result['compile_summary']}")
        print(f"wrote {', '.join(map(str, paths))}", flush=True)
    if skipped:
        print(
            f"!!! DEADLINE: {len(skipped)} case group(s) skipped after {r.plan.deadline_s:.0f} s",
            flush=True,
        )
    for row in problems:
        print(f"!!! {row['status']}: {row['case']}: {row.get('note', '')}", flush=True)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["compare"]:
        from benchmarks import compare

        return compare.main(argv[1:])
    if argv[:1] == ["targets"]:
        from benchmarks import targets

        return targets.main(argv[1:])
    if argv[:1] == ["readme"]:
        from benchmarks import readme

        return readme.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        plan = plan_from_args(args)
    except ValueError as exc:
        print(f"benchmarks: {exc}", file=sys.stderr)
        return 2
    device, why = preflight(plan)
    if device is None:
        print(f"benchmarks: cannot run: {why}", file=sys.stderr, flush=True)
        return 2
    if args.out:
        out = Path(args.out)
    elif plan.smoke:
        out = Path(tempfile.gettempdir()) / f"te_fast-bench-smoke-{os.getpid()}"
    else:  # untracked: the checked-in benchmarks/latest.* change only by --out benchmarks
        out = Path(__file__).resolve().parent / "out"
    if not plan.smoke:
        print(planned(plan), flush=True)
        if "softmax" in plan.sections and plan.numel16 * 2 < L2_BYTES * 4:
            print(
                f"!!! warning: softmax tensors of {plan.numel16 * 2 >> 20} MB are within 4x the "
                f"{L2_BYTES >> 20} MB L2: their bandwidth can exceed what HBM gives",
                flush=True,
            )
    return run(plan, device, out, argv)


if __name__ == "__main__":
    sys.exit(main())
