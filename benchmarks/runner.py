"""One run's state: result rows, the ceilings, the deadline, the compile log, loud problems."""

from __future__ import annotations

import contextlib
import sys
import time
import traceback

import torch

from benchmarks import peers
from benchmarks.cases import Plan
from benchmarks.checks import Check
from benchmarks.roofline import CEILING_MIX, Traffic, roofline_ms
from benchmarks.timing import Stats, sync

PROBLEMS = ("WRONG", "ERROR")


class Fatal(Exception):
    """A CUDA error that poisons the context: every later case would fail, so the run stops."""


def is_fatal(exc: BaseException) -> bool:
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(exc, accel):
        return True
    msg = str(exc)
    return any(s in msg for s in ("CUDA error", "illegal memory access", "device-side assert"))


def case_key(section: str, impl: str, **fields) -> str:
    """'softmax/scaled_softmax_fwd/bf16/sk=128/te_fast': the row's identity across runs."""
    parts = [section, fields.get("op"), fields.get("config"), fields.get("dtype")]
    if fields.get("sk") is not None:
        parts.append(f"sk={fields['sk']}")
    parts.append(impl)
    return "/".join(str(p) for p in parts if p)


def base_row(section: str, impl: str, **fields) -> dict:
    return {"case": case_key(section, impl, **fields), "section": section, "impl": impl, **fields}


class Runner:
    def __init__(self, plan: Plan, device: torch.device):
        self.plan = plan
        self.device = device
        self.rows: list[dict] = []
        self.compiles: list[dict] = []
        # GB/s (bytes read + written a second) of the ceiling kernels: copy, add, fill
        # (roofline.CEILING_MIX); filled by ops_bench.run_ceiling
        self.ceilings: dict[str, float] = {}
        self.softmax_compile_s = 0.0
        self.started = time.perf_counter()

    @property
    def ceiling_gbps(self) -> float | None:
        """The copy ceiling: the yardstick of fraction_of_ceiling and of the conversions."""
        return self.ceilings.get("copy")

    # ------------------------------------------------------------------ time budget
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def expired(self) -> bool:
        return self.elapsed() > self.plan.deadline_s

    # ------------------------------------------------------------------ rows
    def emit(self, row: dict) -> dict:
        row.setdefault("status", "ok")
        row["t_s"] = round(self.elapsed(), 2)
        self.rows.append(row)
        if row["status"] in PROBLEMS:
            if not self.plan.smoke:
                print(format_row(row), flush=True)
            loud = f"!!! {row['status']}: {row['case']}: {row.get('note', '')}"
            print(loud, flush=True)
            print(loud, file=sys.stderr, flush=True)
        elif not self.plan.smoke:
            print(format_row(row), flush=True)
        return row

    def skip(self, row: dict, why: str) -> dict:
        return self.emit(dict(row, status="skipped", note=why))

    def checked(self, row: dict, chk: Check | None) -> dict:
        """Attach a check's verdict: a failed check makes the row WRONG, whatever its speed."""
        if chk is None:
            return row
        row["check"] = {"ok": chk.ok, "error": chk.error, "bound": chk.bound, "where": chk.where}
        if not chk.ok:
            row["status"] = "WRONG"
            row["note"] = f"output differs from the reference: {chk.describe()}"
        return row

    def bandwidth(self, row: dict, stats: Stats, nbytes: int, chk: Check | None) -> dict:
        """Emit a timed row: bytes (nbytes as counted), gbps (bytes / median time, GB/s) and
        fraction_of_ceiling (gbps / the copy ceiling)."""
        gbps = nbytes / (stats.median_ms * 1e-3) / 1e9
        row.update(
            median_ms=stats.median_ms, iqr_ms=stats.iqr_ms, reps=stats.n, bytes=nbytes, gbps=gbps
        )
        if self.ceiling_gbps:
            row["fraction_of_ceiling"] = gbps / self.ceiling_gbps
        return self.emit(self.checked(row, chk))

    def op_bandwidth(self, row: dict, stats: Stats, traffic: Traffic, chk: Check | None) -> dict:
        """Emit a softmax op's row, against its must-move roofline (roofline.py):
        - read_bytes, write_bytes, must_move_bytes: what the op must move;
        - full_row_bytes: the count before (whole rows read and written); bytes, gbps and
          fraction_of_ceiling keep that meaning (runs before the roofline compare on it);
        - roofline_ms: the time the ceiling kernels take to move the must-move bytes
          (roofline.roofline_ms), roofline_ceilings: which of them ("copy+fill", ...);
        - fraction_of_roofline = roofline_ms / median_ms: the headline figure (1.0 = the op
          runs at the speed of the ceiling kernels moving its bytes)."""
        row.update(
            read_bytes=traffic.read_bytes,
            write_bytes=traffic.write_bytes,
            must_move_bytes=traffic.must_move_bytes,
            full_row_bytes=traffic.full_row_bytes,
        )
        if CEILING_MIX.keys() <= self.ceilings.keys():
            ms, used = roofline_ms(traffic.read_bytes, traffic.write_bytes, self.ceilings)
            row.update(
                roofline_ms=ms, roofline_ceilings=used, fraction_of_roofline=ms / stats.median_ms
            )
        return self.bandwidth(row, stats, traffic.full_row_bytes, chk)

    @contextlib.contextmanager
    def guard(self, row: dict):
        """Run one case; an exception becomes a loud ERROR row and the run goes on, except for
        a CUDA error (the context is gone): then the row is written and the run stops (Fatal)."""
        try:
            yield
        except Fatal:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a visible row
            traceback.print_exc(file=sys.stderr)
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            self.emit(dict(row, status="ERROR", note=f"{type(exc).__name__}: {first}"))
            if is_fatal(exc):
                raise Fatal(f"{row['case']}: {type(exc).__name__}: {first}") from exc
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    # ------------------------------------------------------------------ compiles
    def first_call(self, label: str, fn, *, expect_compile: bool = True):
        """Call fn() once, timing it as 'compile + first run'; log how many graphs dynamo made.

        expect_compile: a call that compiled nothing ran eagerly (or from a stale cache): error.
        """
        before = peers.compile_counters()
        t0 = time.perf_counter()
        out = fn()
        sync(self.device)
        seconds = time.perf_counter() - t0
        after = peers.compile_counters()
        entry = {"label": label, "seconds": round(seconds, 2)}
        entry.update({k: after[k] - before[k] for k in after})
        self.compiles.append(entry)
        if not self.plan.smoke:
            print(
                f"compile  {label}: {seconds:.1f} s, {entry['unique_graphs']} graph(s)", flush=True
            )
        if expect_compile and entry["unique_graphs"] < 1:
            raise RuntimeError(f"{label}: torch.compile compiled no graph (ran eagerly?)")
        if entry["graph_breaks"]:
            raise RuntimeError(f"{label}: {entry['graph_breaks']} graph break(s)")
        return out, entry

    # ------------------------------------------------------------------ summary
    def problems(self) -> list[dict]:
        return [r for r in self.rows if r["status"] in PROBLEMS]


def format_row(row: dict) -> str:
    """One progress line per result."""
    head = f"{row['section']:<8} {row.get('dtype') or '':<5} {row['case'].split('/', 1)[1]:<64}"
    parts = [head, f"{row.get('shape', ''):<22}"]
    if row["status"] == "skipped":
        return " ".join(parts + [f"skipped: {row.get('note', '')}"])
    if "wall_ms" in row:
        parts.append(f"wall {row['wall_ms']:8.3f} ms/it ±{row['wall_iqr_ms']:.3f}")
    if "median_ms" in row:
        parts.append(f"{row['median_ms']:8.3f} ms ±{row['iqr_ms']:.3f}")
    if "gbps" in row:
        parts.append(f"{row['gbps']:6.0f} GB/s")
    if row.get("fraction_of_roofline") is not None:
        parts.append(f"{100 * row['fraction_of_roofline']:5.1f}% of roofline")
    elif row.get("fraction_of_ceiling") is not None:
        parts.append(f"{100 * row['fraction_of_ceiling']:5.1f}% of copy")
    if row.get("peak_extra_bytes") is not None:
        parts.append(f"peak +{row['peak_extra_bytes'] / 2**30:.2f} GiB")
    if row.get("note"):
        parts.append(f"({row['note']})")
    return "  ".join(parts)
