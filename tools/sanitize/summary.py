"""One line per compute-sanitizer tool from tools/sanitize/run.sh's logs; exit 1 on any finding.

    python tools/sanitize/summary.py OUTDIR [--timeout S] memcheck racecheck initcheck synccheck

A tool passes when its log has a summary with 0 errors (racecheck: 0 hazards, errors and
warnings alike), its exit code is 0 and the driver said it was done. Findings are attributed
to te_fast's kernels or to others (torch, cuBLAS) by the kernel names in the log.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)"
)
DONE = re.compile(r"sanitize_ops: done: (.*)")
KERNEL = re.compile(r"(?:in kernel|at) (?:void )?([\w:<>]+)")
TIMEOUT_CODES = (124, 137)


def summarize(tool: str, log: str, out: str, rc: int | None, timeout: float | None = None):
    """(passed, line) for one tool from its sanitizer log, the driver's output and exit code."""
    errors = None
    m = ERROR_SUMMARY.search(log)
    if m:
        errors = int(m.group(1))
    r = RACE_SUMMARY.search(log)
    detail = ""
    if r:
        hazards, race_errors, warnings = (int(g) for g in r.groups())
        errors = max(errors or 0, hazards, race_errors + warnings)
        detail = f" ({race_errors} errors, {warnings} warnings)"
    done = DONE.search(out)
    what = done.group(1) if done else "driver did not finish"
    if rc in TIMEOUT_CODES:
        reached = [line for line in out.splitlines() if line.startswith("sanitize_ops: ")]
        where = f"; last: {reached[-1].removeprefix('sanitize_ops: ')}" if reached else ""
        return False, f"{tool}: TIMEOUT after {timeout or '?'} s ({what}{where})"
    if errors is None:
        tail = " | ".join(line.strip() for line in (out or log).strip().splitlines()[-3:])
        return False, f"{tool}: no sanitizer summary (exit {rc}): {tail[-300:]}"
    kernels = [k for k in KERNEL.findall(log) if "::" in k or k.startswith("_Z")]
    ours = sum("te_fast" in k for k in kernels)
    where = ""
    if errors:
        others = sorted({k.split("<")[0] for k in kernels if "te_fast" not in k})[:3]
        where = f"; in te_fast kernels: {ours}" + (
            f", others: {', '.join(others)}" if others else ""
        )
    passed = errors == 0 and rc == 0 and done is not None
    status = (
        "" if passed else f" [FAIL: exit {rc}" + ("" if done else ", driver did not finish") + "]"
    )
    return passed, f"{tool}: {errors} errors{detail}{where}; {what}{status}"


def _read(outdir: Path, tool: str, suffix: str) -> str:
    path = outdir / f"{tool}.{suffix}"
    return path.read_text(errors="replace") if path.exists() else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("tools", nargs="+")
    parser.add_argument("--timeout", type=float, default=None)
    args = parser.parse_args(argv)
    outdir = Path(args.outdir)
    ok = True
    for tool in args.tools:
        rc_text = _read(outdir, tool, "rc").strip()
        rc = int(rc_text) if rc_text.lstrip("-").isdigit() else None
        log, out = _read(outdir, tool, "log"), _read(outdir, tool, "out")
        passed, line = summarize(tool, log, out, rc, args.timeout)
        ok &= passed
        print(line)
    print("sanitize: PASS (0 findings)" if ok else "sanitize: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
