"""python -m benchmarks readme: README.md's performance section, made from a run's latest.json.

The section between the lines `<!-- performance:begin ... -->` and `<!-- performance:end -->` is
generated, never typed: the run's date, GPU, torch and command, the softmax ops table and the
module table, every figure computed from the run's rows. `--check` writes nothing and exits 1
with a diff when README.md is not what the command would write, so that a test and CI keep the
README and benchmarks/latest.json in step.
Exit codes: 0 written (or, with --check, already so); 1 --check found a difference; 2 an
unreadable run, a smoke run or a README without the markers.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import math
import sys
import textwrap
from pathlib import Path

from benchmarks import targets
from benchmarks.cases import SOFTMAX_OPS
from benchmarks.compare import load
from benchmarks.report import ceilings_text

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "latest.json"
README = ROOT / "README.md"
BEGIN = "<!-- performance:begin (python -m benchmarks readme) -->"
END = "<!-- performance:end -->"
COMMAND = "python -m benchmarks readme"

# Rows from this length on get a column each; shorter ones share a range column. TE's kernels
# stop at 16384 and register-resident rows start to spill there: the long columns tell apart
# what the range would hide.
LONG_SK = 16384

# The ops table, in the order shown: (label, impl, op, dtype).
OPS_TABLE = (
    ("te_fast forward", "te_fast", "scaled_softmax_fwd", "bf16"),
    ("te_fast masked forward", "te_fast", "scaled_masked_softmax_fwd", "bf16"),
    ("te_fast backward", "te_fast", "scaled_softmax_bwd", "bf16"),
    ("TE's kernel forward", "te", "scaled_softmax_fwd", "bf16"),
    ("TE's kernel masked forward", "te", "scaled_masked_softmax_fwd", "bf16"),
    ("TE's kernel backward", "te", "scaled_softmax_bwd", "bf16"),
    ("te_fast forward", "te_fast", "scaled_softmax_fwd", "fp32"),
    ("te_fast masked forward", "te_fast", "scaled_masked_softmax_fwd", "fp32"),
    ("te_fast backward", "te_fast", "scaled_softmax_bwd", "fp32"),
    ("`torch.softmax`", "torch.softmax", "softmax_fwd", "bf16"),
    ("inductor composite", "inductor", "softmax_fwd", "bf16"),
    ("read-once Triton peer", "triton", "softmax_fwd", "bf16"),
)
# The module table: (label, impl); None is the fastest fused SDPA backend (its best_fused row).
MODULE_TABLE = (
    ("te_fast eager", "te_fast"),
    ("te_fast `torch.compile`", "te_fast.compile"),
    ("unfused roofline", "roofline"),
    ("composite, inductor", "composite.inductor"),
    ("composite, eager", "composite"),
    ("SDPA, fastest fused", None),
)
MODULE_CONFIGS = ("causal", "padding", "thd")
MASKING_NAMES = {
    "none": "plain",
    "mask": "masked",
    "upper_triang": "upper-triangular",
    "aligned_causal": "aligned-causal",
}
BROKEN = ("WRONG", "ERROR")


# ----------------------------------------------------------------------------- figures


def _span(values: list[float], fmt) -> str:
    """'lo–hi' of values as fmt writes them; one figure where both ends read the same."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo.rstrip('%x')}–{hi}"


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def _times(v: float) -> str:
    return f"{v:.2f}x" if v < 2 else f"{v:.1f}x"


def _cell(rows: list[dict], key: str) -> str:
    """The span of key over rows; a WRONG or ERROR among them shows instead of any figure."""
    broken = sorted({r["status"] for r in rows if r["status"] in BROKEN})
    if broken:
        return " ".join(f"**{s}**" for s in broken)
    values = [r[key] for r in rows if r["status"] == "ok" and r.get(key) is not None]
    return _span(values, _pct) if values else "–"


def fraction_key(run: dict) -> str:
    """The softmax rows' headline figure: of the must-move roofline where the run has it (runs
    since the roofline fields), else of the copy ceiling (full rows)."""
    has_roofline = any("fraction_of_roofline" in r for r in _plain_softmax(run))
    return "fraction_of_roofline" if has_roofline else "fraction_of_ceiling"


def _plain_softmax(run: dict) -> list[dict]:
    """The softmax rows of the (dtype, sk) cases: not the square or misaligned ones."""
    return [r for r in run["rows"] if r["section"] == "softmax" and r.get("config") is None]


def ops_table(run: dict) -> list[str]:
    """OPS_TABLE's rows that the run holds: the short rows as a range, each long row alone."""
    key, rows = fraction_key(run), _plain_softmax(run)
    sks = sorted({r["sk"] for r in rows if r.get("sk")})
    short, long = [sk for sk in sks if sk < LONG_SK], [sk for sk in sks if sk >= LONG_SK]
    columns = [(f"sk {_span(short, str)}", short)] if short else []
    columns += [(str(sk), [sk]) for sk in long]
    lines = [
        "| op | " + " | ".join(name for name, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for label, impl, op, dtype in OPS_TABLE:
        mine = [r for r in rows if (r["impl"], r.get("op"), r.get("dtype")) == (impl, op, dtype)]
        if not any(r["status"] != "skipped" for r in mine):
            continue  # not in this run (a peer not asked for, a dtype not run)
        cells = [_cell([r for r in mine if r.get("sk") in col], key) for _, col in columns]
        lines.append(f"| {label}, {dtype} | " + " | ".join(cells) + " |")
    return lines


def fp16_spread(run: dict) -> int | None:
    """Points (rounded up) by which te_fast's fp16 rows differ from its bf16 rows at most."""
    key = fraction_key(run)
    ok = {
        (r["op"], r["sk"], r["dtype"]): r[key]
        for r in _plain_softmax(run)
        if r["impl"] == "te_fast" and r["status"] == "ok" and r.get(key) is not None
    }
    gaps = [abs(v - ok[(op, sk, "bf16")]) for (op, sk, dt), v in ok.items()
            if dt == "fp16" and (op, sk, "bf16") in ok]  # fmt: skip
    return math.ceil(100 * max(gaps) - 1e-9) if gaps else None  # 2.0000001 points is 2


def te_ratios(run: dict) -> tuple[list[str], list[str], int] | None:
    """TE's median time / te_fast's on the same tensors (same op, dtype, length and layout),
    per op and direction: (forward spans, backward spans, longest row TE took); None without
    TE rows."""
    by_key = {
        (r["impl"], r.get("op"), r.get("dtype"), r.get("sk"), r.get("config")): r
        for r in run["rows"]
        if r["section"] == "softmax" and r["status"] == "ok" and r.get("median_ms")
    }
    spans: dict[str, list[str]] = {"fwd": [], "bwd": []}
    longest = 0
    for op in SOFTMAX_OPS:
        for direction, name in (("fwd", f"{op.fwd}_fwd"), ("bwd", op.bwd)):
            ratios = []
            for (impl, o, dtype, sk, config), te in by_key.items():
                ours = by_key.get(("te_fast", o, dtype, sk, config))
                if impl == "te" and o == name and ours:
                    ratios.append(te["median_ms"] / ours["median_ms"])
                    longest = max(longest, sk)
            if ratios:
                spans[direction].append(f"{MASKING_NAMES[op.masking]} {_span(ratios, _times)}")
    if not (spans["fwd"] or spans["bwd"]):
        return None
    return spans["fwd"], spans["bwd"], longest


def _module_rows(run: dict) -> dict[tuple[str, str], dict]:
    return {
        (r["impl"], r.get("config")): r
        for r in run["rows"]
        if r["section"] == "module" and r.get("dtype") == _module_dtype(run)
    }


def _module_dtype(run: dict) -> str | None:
    dtypes = [r.get("dtype") for r in run["rows"] if r["section"] == "module"]
    return "bf16" if "bf16" in dtypes else (dtypes[0] if dtypes else None)


def _ms(row: dict | None) -> str:
    if row is None or row["status"] == "skipped":
        return "–"
    if row["status"] != "ok":
        return f"**{row['status']}**"
    return f"{row['median_ms']:.2f} ms"


def _module_cell(rows: dict, impl: str | None, config: str, first: bool) -> tuple[str, dict | None]:
    """(cell, row) of impl in config; the roofline row's cell also holds te_fast's time / it."""
    if impl is None:  # the fastest fused SDPA backend, named
        row = next((r for (_, c), r in rows.items() if c == config and r.get("best_fused")), None)
        cell = _ms(row)
        return (cell if cell == "–" else f"{cell} ({row['impl'].removeprefix('sdpa.')})"), row
    row = rows.get((impl, config))
    if impl != "roofline" or row is None or row["status"] != "ok":
        return _ms(row), row
    x = row.get("x_roofline")
    ratio = "" if x is None else f" ({'te_fast ' if first else ''}{x:.2f}x)"
    return f"{row['bound_ms']:.2f} ms{ratio}", row


def module_table(run: dict) -> list[str]:
    """MODULE_TABLE in the run's bf16 (else first) dtype: time per configuration and the peak
    extra memory of the first configuration that has one."""
    rows = _module_rows(run)
    configs = [c for c in MODULE_CONFIGS if any(config == c for _, config in rows)]
    if not configs:
        return []
    heads = []
    for c in configs:
        thd = rows.get(("te_fast", c)) if c == "thd" else None
        heads.append(f"{c} (t={thd['tokens']})" if thd and thd.get("tokens") else c)
    lines = [
        "| | " + " | ".join(heads) + " | peak extra memory |",
        "|---|" + "---:|" * (len(configs) + 1),
    ]
    for label, impl in MODULE_TABLE:
        cells, peak = [], None
        for c in configs:
            cell, row = _module_cell(rows, impl, c, first=all(x == "–" for x in cells))
            cells.append(cell)
            if peak is None and row is not None and row.get("peak_extra_bytes") is not None:
                peak = f"{row['peak_extra_bytes'] / 2**30:.2f} GiB"
        if any(c != "–" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {peak or '–'} |")
    return lines


def targets_met(run: dict) -> tuple[int, int]:
    """(met, asserted) of the performance issue's targets on this run (benchmarks/targets.py)."""
    asserted = [t for t in targets.evaluate(run) if t.asserted]
    return sum(t.verdict == "met" for t in asserted), len(asserted)


# ----------------------------------------------------------------------------- the section


def _when(env: dict) -> str:
    """'2026-12-06 02:38 UTC' from the run's ISO date; the text itself if it is not one."""
    try:
        when = datetime.datetime.fromisoformat(env["date"])
    except (KeyError, TypeError, ValueError):
        return str(env.get("date", "an unknown date"))
    if when.tzinfo is not None:
        when = when.astimezone(datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def _count(n: int) -> str:
    """268435456 -> '256M' (powers of 1024, as --numel takes them)."""
    for suffix, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


def _para(text: str) -> list[str]:
    """text wrapped at 100 columns, never inside a `code span` (a command stays greppable)."""
    parts = text.split("`")
    parts[1::2] = [part.replace(" ", "\0") for part in parts[1::2]]
    lines = textwrap.wrap("`".join(parts), 100, break_long_words=False, break_on_hyphens=False)
    return [line.replace("\0", " ") for line in lines]


def _run_text(run: dict) -> str:
    env = run.get("env") or {}
    state = run.get("state", "complete")
    return (
        f"The latest GPU run: {env.get('gpu') or 'no GPU'}, torch {env.get('torch', '?')}, "
        f"{_when(env)}{'' if state == 'complete' else f' (a {state} run)'}, "
        f"`{run.get('command', '?')}`; all its tables: "
        "[benchmarks/latest.md](benchmarks/latest.md)."
    )


def _softmax_text(run: dict, te_longest: int | None) -> str:
    """What the ops table's percentages are of, and on what."""
    if fraction_key(run) == "fraction_of_roofline":
        text = (
            "Softmax ops as % of their must-move roofline at the ceilings measured in the run "
            f"({ceilings_text(run)}, bytes read + written a second; "
            "[how it counts](docs/performance.md#how-the-rooflines-count))"
        )
    else:
        text = (
            "Softmax ops as % of the copy ceiling measured in the run "
            f"({ceilings_text(run)}, bytes read + written a second, full rows)"
        )
    numel = (run.get("plan") or {}).get("numel16")
    if numel:
        text += f", {_count(numel)} elements a case (fp32 {_count(numel // 2)})"
    spread = fp16_spread(run)
    if spread is not None:
        text += f"; fp16 is within {spread} points of bf16"
    if te_longest:
        text += (
            ". TE's kernels are Transformer Engine's own `fused_softmax/*.cu`, built from its "
            f"sources ([docs/te_kernels.md](docs/te_kernels.md)); they take rows up to {te_longest}"
        )
    return text + ":"


def _te_text(fwd: list[str], bwd: list[str]) -> str:
    spans = "; ".join(f"{d} {', '.join(x)}" for d, x in (("forward", fwd), ("backward", bwd)) if x)
    return (
        "TE's kernel time / te_fast's on the same tensors, at every length TE takes (below 1: TE "
        f"is faster): {spans} "
        "([docs/performance.md](docs/performance.md#tes-kernels-beside-te_fast))."
    )


def _module_text(run: dict) -> str:
    shape = next(r for r in run["rows"] if r["section"] == "module").get("shape", "")
    return (
        f"`UnfusedDotProductAttention`, {shape}, {_module_dtype(run)}, forward + backward, "
        "median times; the unfused roofline is cuBLAS's GEMMs of the same shapes plus the "
        "softmax's (and THD conversions') bytes at the run's ceilings, the lower bound of any "
        "unfused implementation:"
    )


def render(run: dict) -> str:
    """The section between the markers, from the run alone."""
    te = te_ratios(run)
    if _plain_softmax(run):
        text = f"{_run_text(run)} {_softmax_text(run, te[2] if te else None)}"
        lines = _para(text) + [""] + ops_table(run)
    else:
        lines = _para(_run_text(run))
    if te:
        lines += [""] + _para(_te_text(te[0], te[1]))
    module = module_table(run)
    if module:
        lines += [""] + _para(_module_text(run)) + [""] + module
    met, asserted = targets_met(run)
    lines += [""] + _para(
        f"The performance targets ({met} of {asserted} met on this run: "
        "`python -m benchmarks targets benchmarks/latest.json`), why the misses stay, the ncu "
        f"figures and older runs: [docs/performance.md](docs/performance.md). This section is "
        f"written by `{COMMAND}` from benchmarks/latest.json."
    )
    return "\n".join(lines) + "\n"


def splice(text: str, section: str) -> str:
    """text with what lies between the BEGIN and END lines replaced by section (a blank line
    either side); every other byte kept."""
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise ValueError(
            f"needs one line {BEGIN!r} and after it one line {END!r} (found {len(begins)} and "
            f"{len(ends)}); put them under '## Performance' around the generated section"
        )
    return "".join(lines[: begins[0] + 1]) + "\n" + section + "\n" + "".join(lines[ends[0] :])


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=f"{COMMAND}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", default=str(RUN), help="a run's latest.json (default: this checkout's "
                   "benchmarks/latest.json)")  # fmt: skip
    p.add_argument("--readme", default=str(README), help="default: this checkout's README.md")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and print a diff if the README is not what this would write",
    )
    args = p.parse_args(argv)
    run_path, readme = Path(args.run), Path(args.readme)
    try:
        run = load(run_path)
        if run.get("smoke"):
            raise ValueError("a smoke run (CPU harness check): its timings mean nothing")
        old = readme.read_bytes().decode("utf-8")  # bytes: every line ending outside kept
        new = splice(old, render(run))
    except (OSError, ValueError) as exc:
        print(f"benchmarks readme: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new == old:
            print(f"{_shown(readme)}: the performance section is {_shown(run_path)}'s")
            return 0
        diff = difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"{_shown(readme)}",
            f"{_shown(readme)} (made from {_shown(run_path)})",
        )
        sys.stdout.writelines(diff)
        print(
            f"benchmarks readme: {_shown(readme)}'s performance section is not what "
            f"{_shown(run_path)} makes of it: run `{COMMAND}` and commit {_shown(readme)}",
            file=sys.stderr,
        )
        return 1
    if new == old:
        print(f"{_shown(readme)}: the performance section already is {_shown(run_path)}'s")
        return 0
    readme.write_bytes(new.encode("utf-8"))
    print(f"{_shown(readme)}: performance section written from {_shown(run_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
