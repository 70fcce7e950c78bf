"""Writes a run: latest.json (every row and the environment), latest.md (tables), latest.png."""

from __future__ import annotations

import datetime
import json
import platform
import sys
from pathlib import Path

import torch

from benchmarks.cases import CAUSAL_OPS, DTYPES, SOFTMAX_OPS

SCHEMA = 1


def environment(device: torch.device) -> dict:
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "triton": None,
    }
    if device.type == "cuda":
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    return env


def write_json(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "latest.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(path)  # a kill mid-write never leaves half a file
    return path


def write_all(result: dict, out: Path) -> list[Path]:
    paths = [write_json(result, out)]
    md = out / "latest.md"
    md.write_text(render_markdown(result))
    paths.append(md)
    png = write_png(result, out / "latest.png")
    if png is not None:
        paths.append(png)
    return paths


# ----------------------------------------------------------------------------- markdown


def _rows(result: dict, **match) -> list[dict]:
    return [r for r in result["rows"] if all(r.get(k) == v for k, v in match.items())]


def _cell_pct(row: dict | None, key: str = "fraction_of_roofline") -> str:
    """A row's fraction (of its must-move roofline, or key's yardstick) as a percentage."""
    if row is None:
        return "–"
    if row["status"] != "ok":
        return {"skipped": "skip"}.get(row["status"], f"**{row['status']}**")
    frac = row.get(key)
    return "–" if frac is None else f"{100 * frac:.0f}%"


def _plain_softmax(result: dict) -> list[dict]:
    """The softmax rows of the (dtype, sk) cases: all but the square ones."""
    return [r for r in _rows(result, section="softmax") if r.get("config") != "square"]


def _softmax_tables(result: dict) -> list[str]:
    lines = []
    softmax = _plain_softmax(result)
    dtypes = [d for d in DTYPES if any(r.get("dtype") == d for r in softmax)]
    sks = sorted({r["sk"] for r in softmax if r.get("sk")})
    for op in SOFTMAX_OPS:
        for direction in ("fwd", "bwd"):
            name = f"{op.name}_{direction}"
            peer_op = "masked_softmax_fwd" if op.masking == "mask" else "softmax_fwd"
            if direction == "fwd":
                cols = [
                    ("te_fast", name),
                    ("torch.softmax", "softmax_fwd"),
                    ("inductor", peer_op),
                    ("triton", "softmax_fwd"),
                ]
            else:
                cols = [("te_fast", name), ("torch.softmax", "softmax_bwd")]
            for dtype in dtypes:
                lines += [f"### {name}, {dtype}", ""]
                lines.append("| sk | " + " | ".join(impl for impl, _ in cols) + " |")
                lines.append("|---:|" + "---:|" * len(cols))
                for sk in sks:
                    cells = []
                    for impl, op_name in cols:
                        hit = [
                            r
                            for r in _rows(result, op=op_name, dtype=dtype, sk=sk, impl=impl)
                            if r["section"] == "softmax" and r.get("config") != "square"
                        ]
                        cells.append(_cell_pct(hit[0] if hit else None))
                    lines.append(f"| {sk} | " + " | ".join(cells) + " |")
                lines.append("")
    return lines


def _square_tables(result: dict) -> list[str]:
    """The causal ops on square tensors (ops_bench.run_square): te_fast and TE, % of the
    must-move roofline, and TE's time / te_fast's on the same tensors."""
    square = _rows(result, section="softmax", config="square")
    if not square:
        return []
    lines = [
        "## Causal ops on square tensors: te_fast and TE",
        "",
        "Both on the same [b, h, s, s] tensors (the upper-triangular op on their [b·h, s, s] "
        "view; TE requires sq = sk there), about as many elements as the cases above; % of the "
        "must-move roofline; te / te_fast = TE's median time over te_fast's.",
        "",
    ]
    dtypes = [d for d in DTYPES if any(r.get("dtype") == d for r in square)]
    sizes = sorted({r["sk"] for r in square if r.get("sk")})

    by_key = {(r["impl"], r.get("op"), r.get("dtype"), r.get("sk")): r for r in square}

    def time_ratio(te: dict | None, ours: dict | None) -> str:
        if not (te and ours and te["status"] == ours["status"] == "ok"):
            return "–"
        return f"{te['median_ms'] / ours['median_ms']:.2f}"

    for op in CAUSAL_OPS:
        for dtype in dtypes:
            lines += [
                f"### {op.name}, {dtype}",
                "",
                "| s | shape | fwd te_fast | fwd te | fwd te / te_fast | bwd te_fast | bwd te "
                "| bwd te / te_fast |",
                "|---:|---|---:|---:|---:|---:|---:|---:|",
            ]
            for s in sizes:
                cells = []
                shape = ""
                for name in (f"{op.fwd}_fwd", op.bwd):
                    ours, te = (by_key.get((impl, name, dtype, s)) for impl in ("te_fast", "te"))
                    shape = shape or (ours or {}).get("shape", "")
                    cells += [_cell_pct(ours), _cell_pct(te), time_ratio(te, ours)]
                lines.append(f"| {s} | {shape} | " + " | ".join(cells) + " |")
            lines.append("")
    return lines


def _fmt_ms(row: dict, key: str = "median_ms", iqr: str = "iqr_ms") -> str:
    return f"{row[key]:.3f} ± {row[iqr]:.3f}" if key in row else "–"


def _opt(row: dict, key: str, fmt: str) -> str:
    return fmt.format(row[key]) if row.get(key) is not None else "–"


def _status(row: dict) -> str:
    s = row["status"]
    note = row.get("note", "")
    return s if s == "ok" else f"**{s}** {note}".strip()


def render_markdown(result: dict) -> str:
    env = result["env"]
    lines = [
        "# te_fast benchmark"
        + (" (SMOKE: CPU harness check, timings mean nothing)" if result.get("smoke") else ""),
        "",
        f"{env.get('gpu') or 'CPU'}, torch {env['torch']}, CUDA {env['cuda']}, "
        f"triton {env.get('triton')}, {env['date']}",
        "",
        f"Command: `{result['command']}`  ",
        f"Total wall time {result.get('total_wall_s', 0):.0f} s; ceilings (bytes read + written "
        f"per second) {ceilings_text(result)}; medians of CUDA-event timings, IQR beside them.  ",
        f"Compiles: {result.get('compile_summary', {})}",
        "",
    ]
    problems = [r for r in result["rows"] if r["status"] in ("WRONG", "ERROR")]
    if problems:
        lines += ["## PROBLEMS", ""]
        lines += [f"- **{r['status']}** `{r['case']}`: {r.get('note', '')}" for r in problems]
        lines.append("")
    if _plain_softmax(result):
        lines += [
            "## Softmax ops: % of the must-move roofline",
            "",
            "Must-move bytes: forward reads the kept part of x (all of it and the bool mask for "
            "the masked op) and writes all of y; backward reads the kept part of dy and y and "
            "writes all of dx; a causal row keeps a prefix of its columns. % = the time the "
            "ceiling kernels of the nearest read:write mix take to move those bytes (copy 1:1, "
            "add 2:1, fill 0:1; benchmarks/roofline.py) / the op's time; fraction_of_ceiling in "
            "latest.json keeps the full-row count against the copy ceiling. torch.softmax "
            "is unscaled and unmasked; inductor is the compiled composite (masked for the "
            "masked op, plain otherwise); triton is the read-once row softmax peer.",
            "",
        ]
        lines += _softmax_tables(result)
    lines += _square_tables(result)
    conv = _rows(result, section="convert")
    if conv:
        lines += [
            "## Conversions",
            "",
            "thd→bshd counts t rows read + b·s rows written; "
            "bshd→thd counts t rows read + t rows written.",
            "",
            "| op | dtype | shape | ms | GB/s | % of copy | status |",
            "|---|---|---|---:|---:|---:|---|",
        ]
        for r in conv:
            lines.append(
                f"| {r.get('op', '')} | {r.get('dtype', '')} | {r.get('shape', '')} | "
                f"{_fmt_ms(r)} | {r.get('gbps', 0):.0f} | {_cell_pct(r, 'fraction_of_ceiling')} | "
                f"{_status(r)} |"
            )
        lines.append("")
    lines += _module_table(result)
    lines += _launch_table(result, "small", "Small shape")
    lines += _launch_table(result, "stack", "Stack of layers")
    return "\n".join(lines) + "\n"


def ceilings_text(result: dict) -> str:
    """'copy 3029, add 2900, fill 3100 GB/s': a run's ceilings (only copy in runs before the
    roofline fields)."""
    ceilings = result.get("ceilings_gbps") or {"copy": result.get("ceiling_gbps") or 0}
    return ", ".join(f"{k} {v:.0f}" for k, v in ceilings.items()) + " GB/s"


def _module_table(result: dict) -> list[str]:
    rows = [
        r
        for r in _rows(result, section="module")
        if r["impl"] != "roofline" and r.get("config") != "thd"
    ]
    if not rows:
        return _roofline_table(result)
    lines = [
        "## Module at the training shape (forward + backward)",
        "",
        f"{rows[0].get('shape', '')}; CUDA-event median; speedup = eager composite's time / "
        "this time; x roofline = this time / the unfused full-GEMM bound, x tile = / the "
        "tile-skipping bound (below); peak = max_memory_allocated during one step above the "
        "inputs.",
        "",
        "| dtype | mask | impl | ms | speedup | x roofline | x tile | peak extra GiB | compile s "
        "| status |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        peak = r.get("peak_extra_bytes")
        best = " (fastest fused)" if r.get("best_fused") else ""
        lines.append(
            f"| {r.get('dtype', '')} | {r.get('config', '')} | {r['impl']}{best} | {_fmt_ms(r)} | "
            f"{_opt(r, 'speedup', '{:.2f}x')} | {_opt(r, 'x_roofline', '{:.2f}x')} | "
            f"{_opt(r, 'x_tile_bound', '{:.2f}x')} | "
            f"{'–' if peak is None else f'{peak / 2**30:.2f}'} | "
            f"{_opt(r, 'compile_s', '{:.1f}')} | {_status(r)} |"
        )
    lines.append("")
    return lines + _roofline_table(result)


def _roofline_table(result: dict) -> list[str]:
    rows = _rows(result, section="module", impl="roofline")
    if not rows:
        return []
    thd = {r.get("dtype"): r for r in _rows(result, section="module", impl="te_fast", config="thd")}
    lines = [
        "## The unfused rooflines (forward + backward)",
        "",
        "bound = the six GEMMs alone (cuBLAS `baddbmm`/`bmm` on contiguous [b·h, s, d] operands: "
        "S = QKᵀ, O = PV, dV = PᵀdO, dP = dOVᵀ, dQ = dS·K, dK = dSᵀQ; CUDA-event median) + the "
        "softmax's must-move bytes (forward: the kept scores read, all of P written; backward: "
        "the kept dP and P read, all of dS written; causal keeps the lower triangle, padding "
        "and thd count full rows) at the ceilings of their read:write mix, and, for thd, the "
        "conversions' bytes (q, k, v, dout thd→bshd: t + b·s rows each; out, dq, dk, dv "
        "bshd→thd: 2·t rows each) at the copy ceiling of this run. tile bound = the same with "
        "the GEMMs' time times the share of 128×128 score tiles holding a kept element (tiles "
        "kept). x roofline = te_fast eager's fwd+bwd / bound, x tile = / tile bound; largest "
        "gap = the term of te_fast's profiled step furthest above the bound's (no_kernel: the "
        "step's time no kernel covers).",
        "",
        "| dtype | config | GEMMs ms (TFLOP/s) | softmax ms | convert ms | bound ms | tiles kept "
        "| tile bound ms | te_fast ms | x roofline | x tile | largest gap | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r.get('dtype', '')} | {r.get('config', '')} | "
                         + "– | " * 10 + f"{_status(r)} |")  # fmt: skip
            continue
        config = r["config"]
        if config == "thd" and r.get("dtype") in thd:
            config += f" ({thd[r['dtype']].get('shape', '')})"
        gap = "–"
        if r.get("largest_gap"):
            gap = f"{r['largest_gap']} +{r['gap_ms'][r['largest_gap']]:.3f} ms"
        lines.append(
            f"| {r.get('dtype', '')} | {config} | {r['gemm_ms']:.3f} ({r['gemm_tflops']:.0f}) | "
            f"{r['softmax_ms']:.3f} | {r['convert_ms']:.3f} | {r['bound_ms']:.3f} | "
            f"{100 * r['kept_tile_fraction']:.0f}% | {r['tile_bound_ms']:.3f} | "
            f"{_opt(r, 'te_fast_ms', '{:.3f}')} | {_opt(r, 'x_roofline', '{:.2f}x')} | "
            f"{_opt(r, 'x_tile_bound', '{:.2f}x')} | {gap} | {_status(r)} |"
        )
    lines.append("")
    return lines


def _launch_table(result: dict, section: str, title: str) -> list[str]:
    rows = _rows(result, section=section)
    if not rows:
        return []
    lines = [
        f"## {title} (forward + backward)",
        "",
        f"{rows[0].get('shape', '')}, {rows[0].get('dtype', '')}. Reported: host wall-clock "
        "per iteration (back-to-back, one sync per 10 iterations): this shape is "
        "launch/CPU bound. CUDA-event median beside it; speedup uses the wall time.",
        "",
        "| impl | wall ms/it | CUDA events ms | speedup | compile s | status |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['impl']} | {_fmt_ms(r, 'wall_ms', 'wall_iqr_ms')} | {_fmt_ms(r)} | "
            f"{_opt(r, 'speedup', '{:.2f}x')} | {_opt(r, 'compile_s', '{:.1f}')} | "
            f"{_status(r)} |"
        )
    lines.append("")
    for r in rows:
        if "paired_ratio" in r:
            lines += [
                f"Paired rounds, {r['impl']} / composite (eager, wall clock, the two alternating "
                f"{r.get('paired_rounds', '?')} times): {r['paired_ratio']:.3f} "
                f"(quartiles {r['paired_q1']:.3f}-{r['paired_q3']:.3f}).",
                "",
            ]
    return lines


# ----------------------------------------------------------------------------- plot


def write_png(result: dict, path: Path) -> Path | None:
    """% of the must-move roofline against sk: one panel per dtype and direction."""
    softmax = _plain_softmax(result)
    if not softmax:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"!!! no plot: matplotlib is not importable ({exc})", file=sys.stderr, flush=True)
        return None
    dtypes = [d for d in DTYPES if any(r.get("dtype") == d for r in softmax)]
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(13, 4.2 * len(dtypes)), squeeze=False)
    for i, dtype in enumerate(dtypes):
        for j, direction in enumerate(("fwd", "bwd")):
            ax = axes[i][j]
            for label, series in _series(softmax, dtype, direction).items():
                xs, ys = zip(*sorted(series))
                style = "-o" if label.startswith("te_fast") else "--s"
                ax.plot(xs, ys, style, label=label, markersize=3)
            ax.set_xscale("log", base=2)
            sks = sorted({r["sk"] for r in softmax if r.get("sk")})
            ax.set_xticks(sks, [str(sk) for sk in sks], rotation=45)
            ax.set_ylim(0, max([110.0] + [y for line in ax.get_lines() for y in line.get_ydata()]))
            ax.axhline(100, color="grey", linewidth=0.8)
            ax.set_title(f"softmax {direction}, {dtype}")
            ax.set_xlabel("sk (row length)")
            ax.set_ylabel("% of must-move roofline")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    env = result["env"]
    fig.suptitle(
        f"{env.get('gpu') or 'CPU'} torch {env['torch']} {env['date']}"
        + (" SMOKE" if result.get("smoke") else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _series(rows: list[dict], dtype: str, direction: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in rows:
        if r.get("dtype") != dtype or r["status"] != "ok" or "fraction_of_roofline" not in r:
            continue
        op = r.get("op", "")
        if not op.endswith(direction):
            continue
        if r["impl"] == "te_fast":
            label = f"te_fast {op.removesuffix('_' + direction).removeprefix('scaled_')}"
        else:
            label = r["impl"] + (" masked" if op.startswith("masked") else "")
        out.setdefault(label, []).append((r["sk"], 100 * r["fraction_of_roofline"]))
    return out
