"""Registers and spills of every CUDA kernel, from ptxas, checked against the accepted table.

    python tools/kernel_resources.py                     compile csrc/cuda/*.cu, print the table
    python tools/kernel_resources.py --check             ... and exit 1 on a spill not accepted
    python tools/kernel_resources.py --update            ... and rewrite the accepted table

Compiles each csrc/cuda/*.cu for sm_90 with nvcc (the flags of setup.py's build and of torch's
CUDAExtension; -Xptxas -v), in parallel, and reads ptxas's report: per kernel, the registers a
thread uses and the bytes it spills to local memory (stores and loads). No GPU is needed.

A spill is local-memory traffic in a kernel meant to run at the memory-bandwidth limit, so a new
or a grown one is a regression to measure before it lands. `csrc/cuda/spills.json` lists the
accepted spills (per kernel: spill-store and spill-load bytes a thread, keyed by the mangled
name, with the readable one beside it); --check fails when a kernel spills more than it lists,
or spills and is not listed, and names it. A kernel that now spills less, or is gone, is
reported, not failed: --update records the new table (review its diff). CI runs --check
(.ci/run); registers are printed, not gated (the launch bounds cap them).

The table was first written from 88f867f's kernels (2026-12-04, nvcc 13.0): 39 of 247 spill,
and the benchmark measured the speed of those it times (benchmarks/latest.md). Some were
measured against alternatives that do not spill: the 16-bit masked direct forward of 4 chunks
a thread (16 bytes at 1024 threads an SM; the long kernel in its place lost 3 points at 16K
columns) and the masked 16-bit long kernels on clusters (8 bytes; the mask in shared memory in
their place lost 8 points at 64K), both in benchmarks/runs/h200-2026-12-04-mask-smem.md. The
largest, the fp32 backward of one-element chunks (misaligned rows: 180-212 bytes stored a
thread at 64-512 threads a row), is a fallback path that only `python -m benchmarks
--misaligned` times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "csrc" / "cuda" / "spills.json"
# setup.py's nvcc flags (-O3 -lineinfo) and those torch's CUDAExtension adds, for sm_90.
FLAGS = (
    "-arch=sm_90", "-std=c++17", "-O3", "-lineinfo", "--expt-relaxed-constexpr",
    "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "-Xptxas", "-v",
)  # fmt: skip

_COMPILING = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """{mangled kernel name: {"registers", "spill_stores", "spill_loads"}} from ptxas -v output.

    Per entry function, ptxas prints "Compiling entry function 'K'", then "Function properties
    for K" with its stack and spill bytes, then "Used N registers". Properties of other functions
    (non-inlined device functions) are not kernels and are left out.
    """
    out: dict[str, dict[str, int]] = {}
    entry = props = None
    for line in text.splitlines():
        if m := _COMPILING.search(line):
            entry, props = m.group(1), None
            out[entry] = {"registers": 0, "spill_stores": 0, "spill_loads": 0}
        elif m := _PROPERTIES.search(line):
            props = m.group(1)
        elif (m := _SPILL.search(line)) and props is not None and props == entry:
            out[entry]["spill_stores"], out[entry]["spill_loads"] = int(m[1]), int(m[2])
        elif (m := _USED.search(line)) and entry is not None:
            out[entry]["registers"] = int(m[1])
            entry = props = None
    return out


def demangle(names: list[str]) -> dict[str, str]:
    """Readable names, shortened (c++filt when present; the mangled name otherwise)."""
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    done = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = done.stdout.splitlines()
    if len(lines) != len(names):
        return {n: n for n in names}
    short = ("te_fast_kernels::softmax_detail::", "te_fast_kernels::", "__nv_")
    out = {}
    for n, d in zip(names, lines):
        for s in short:
            d = d.replace(s, "")
        out[n] = re.sub(r"\((\w+::)?\w+Args\)$", "", d)
    return out


def compile_all(nvcc: str, jobs: int) -> dict[str, dict[str, int]]:
    """Compile every csrc/cuda/*.cu; the kernels of all of them. Raises on a compile error."""
    sources = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
    if not sources:
        raise SystemExit("kernel_resources: no csrc/cuda/*.cu")

    def one(src: Path) -> tuple[Path, subprocess.CompletedProcess]:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [nvcc, *FLAGS, f"-I{ROOT / 'csrc'}", "-c", str(src), "-o", f"{tmp}/k.o"]
            return src, subprocess.run(cmd, capture_output=True, text=True)

    kernels: dict[str, dict[str, int]] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for src, done in pool.map(one, sources):
            rel = src.relative_to(ROOT)
            if done.returncode != 0:
                sys.stderr.write(done.stdout + done.stderr)
                raise SystemExit(f"kernel_resources: nvcc failed on {rel} (exit {done.returncode})")
            found = parse_ptxas(done.stdout + done.stderr)
            print(f"nvcc sm_90: {rel} ok ({len(found)} kernels)", flush=True)
            kernels.update(found)
    return kernels


def spills(kernels: dict[str, dict[str, int]]) -> dict[str, list[int]]:
    """{name: [spill-store bytes, spill-load bytes]} of the kernels that spill."""
    return {
        n: [k["spill_stores"], k["spill_loads"]]
        for n, k in sorted(kernels.items())
        if k["spill_stores"] or k["spill_loads"]
    }


def check(now: dict[str, list[int]], accepted: dict[str, list[int]]) -> tuple[list, list]:
    """(failures, notes): a spill not accepted or larger than accepted fails; a smaller or
    vanished one is a note."""
    failures, notes = [], []
    for name, (st, ld) in now.items():
        if name not in accepted:
            failures.append((name, f"spills {st}/{ld} bytes (stores/loads), not accepted"))
        elif st > accepted[name][0] or ld > accepted[name][1]:
            a = accepted[name]
            failures.append((name, f"spills {st}/{ld} bytes, {a[0]}/{a[1]} accepted"))
        elif [st, ld] != accepted[name]:
            notes.append((name, f"spills {st}/{ld} bytes, less than the {accepted[name]} accepted"))
    for name in accepted:
        if name not in now:
            notes.append((name, f"accepted {accepted[name]} but no longer spills (or is gone)"))
    return failures, notes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--table", default=str(TABLE), help="the accepted spills (JSON)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 on a spill not accepted")
    g.add_argument("--update", action="store_true", help="rewrite the table with today's spills")
    p.add_argument("--all", action="store_true", help="print every kernel, not only spilling ones")
    args = p.parse_args(argv)
    if shutil.which(args.nvcc) is None:
        print(f"kernel_resources: {args.nvcc} not found (set NVCC or --nvcc)", file=sys.stderr)
        return 2
    kernels = compile_all(args.nvcc, args.jobs)
    if not kernels:  # a check over nothing would pass: say so instead
        print("kernel_resources: ptxas reported no kernels (its -v format?)", file=sys.stderr)
        return 2
    names = demangle(sorted(kernels))
    now = spills(kernels)
    print(f"{len(kernels)} kernels, {len(now)} spill (registers, spill stores/loads in bytes):")
    for n in sorted(kernels, key=names.get):
        k = kernels[n]
        if args.all or n in now:
            spill = f"{k['spill_stores']:3d}/{k['spill_loads']:3d}"
            print(f"  {k['registers']:3d} regs  {spill}  {names[n]}")
    if args.update:
        lines = ",\n".join(f"  {json.dumps(n)}: {json.dumps([*now[n], names[n]])}" for n in now)
        Path(args.table).write_text(f'{{"spills": {{\n{lines}\n}}}}\n')  # one line a kernel
        print(f"kernel_resources: wrote {len(now)} accepted spills to {args.table}")
        return 0
    if not args.check:
        return 0
    try:
        table = json.loads(Path(args.table).read_text())["spills"]
    except (OSError, ValueError, KeyError) as e:
        print(f"kernel_resources: cannot read {args.table}: {e!r}", file=sys.stderr)
        return 2
    accepted = {n: v[:2] for n, v in table.items()}  # [stores, loads, readable name]
    failures, notes = check(now, accepted)
    more = demangle([n for n, _ in failures + notes if n not in names])
    for name, text in notes:
        print(f"note: {names.get(name) or more[name]}: {text}")
    for name, text in failures:
        print(f"SPILL: {names.get(name) or more[name]}: {text}")
    if failures:
        print(f"kernel_resources: {len(failures)} kernels spill past {args.table}; measure them "
              "on a GPU, then fix or accept them (--update)")  # fmt: skip
        return 1
    print(f"kernel_resources: every spill within {args.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
