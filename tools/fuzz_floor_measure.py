"""Measure SPEC §6's floor on the fuzz: every tensor the fuzz judges, and the floor it needs.

A pytest plugin. Each error-ratio check of the fuzz (suites/checks/attention.judge and the op
checks of suites/fuzz/checks.py) is recorded -- tensor, elements, dtype, error, same-precision
error, each randomly rounded composite's error, largest finite |ref64|, and the verdicts under
four rules: "base" (the composite alone, the per-dtype floor alone), "composite" (the composite
alone with the floor check_ratio applies: the rule before the rounded composites),
"rounded_base" (the rounded composites with the per-dtype floor alone) and "applied"
(check_ratio's own) -- and a ratio failure is NOT raised, so that hypothesis draws every example
(no shrinking). Any other failure (exact zeros, NaN, a contract) still fails the test.

    TE_FUZZ_EXAMPLES=300 TE_FLOOR_MEASURE=/tmp/floor python -m pytest \\
        suites/conformance/test_fuzz.py -m "not gpu" -n 2 -p tools.fuzz_floor_measure \\
        -p no:cacheprovider -q
    python -m tools.fuzz_floor_measure /tmp/floor      # the summary

Each process appends JSON lines to $TE_FLOOR_MEASURE/<pid>.jsonl. `ulps_needed` is the floor a
tensor needs in ulps of its dtype at its largest |ref64| (suites.checks.numerics.ulp): (error -
k x same-precision error) / ulp; `ulps_needed_rel` the same in units of eps x max|ref64|.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict

import pytest
import torch

ENV = "TE_FLOOR_MEASURE"
_state = {"test": "", "example": 0}


def _out_path() -> str | None:
    where = os.environ.get(ENV)
    if not where:
        return None
    os.makedirs(where, exist_ok=True)
    return os.path.join(where, f"{os.getpid()}.jsonl")


def _recording(real_check_ratio):
    from te_conformance.suites.checks import numerics as nm

    def check_ratio(name, impl, ref64, ref_lp, k, dtype=None, rounded=()):
        dtype = dtype or impl.dtype
        a, r, lp = (t.detach().to(torch.float64) for t in (impl, ref64, ref_lp))
        err = nm._abs_diff(a, r)
        ref_err = nm._abs_diff(lp, r)
        max_err = err.max().item() if err.numel() else 0.0
        ref_max = ref_err.max().item() if ref_err.numel() else 0.0
        rounded_errs = [
            e.max().item() if e.numel() else 0.0
            for e in (nm._abs_diff(o.detach().to(torch.float64), r) for o in rounded)
        ]  # fmt: skip
        finite = r[torch.isfinite(r)].abs()
        top = finite.max().item() if finite.numel() else 0.0
        base = nm.floor(dtype)
        need = max_err - k * ref_max
        applied = nm.floor(dtype, r, nm.tiny_ulps(name))
        row = {
            "test": _state["test"], "example": _state["example"], "tensor": name,
            "n": r.numel(), "dtype": str(dtype).removeprefix("torch."), "k": k,
            "err": max_err, "ref_err": ref_max, "rounded_errs": rounded_errs, "top": top,
            "floor": applied,
            "fail_base": bool(max_err > k * ref_max + base),
            "fail_composite": bool(max_err > k * ref_max + applied),
            "ratio_base": max_err / (k * ref_max + base) if ref_max != float("inf") else None,
            "ulps_needed": need / nm.ulp(dtype, top) if top > 0 else None,
            "ulps_needed_rel": need / rel if (rel := torch.finfo(dtype).eps * top) > 0 else None,
        }  # fmt: skip
        try:
            ratio = real_check_ratio(name, impl, ref64, ref_lp, k, dtype, rounded)
            row["fail_applied"] = False
        except nm.RatioError as e:
            ratio = float("nan")
            row["fail_applied"] = True
            row["message"] = str(e)
        path = _out_path()
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
        return ratio

    return check_ratio


def _counting(check):
    def counted(*args, **kwargs):
        _state["example"] += 1
        return check(*args, **kwargs)

    return counted


def pytest_configure(config):
    from te_conformance.suites.checks import attention
    from te_conformance.suites.fuzz import checks as fc

    attention.check_ratio = _recording(attention.check_ratio)
    fc.check_ratio = _recording(fc.check_ratio)
    for name in ("check_softmax_example", "check_module_example"):
        setattr(fc, name, _counting(getattr(fc, name)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    _state["test"] = item.nodeid
    _state["example"] = 0


# tensor sizes [lo, hi) of the summary's table; the last is 1024 and more
BUCKETS = ((0, 8), (8, 16), (16, 32), (32, 64), (64, 65), (65, 128), (128, 256), (256, 1024),
           (1024, 1 << 62))  # fmt: skip


def _offline_verdicts(r: dict) -> None:
    """The rules the rows let us re-judge offline: ``rounded_base``, the randomly rounded
    composites with the per-dtype floor alone (no tiny-tensor term)."""
    if "rounded_errs" in r and r["ref_err"] != float("inf"):
        e = max([r["ref_err"], *r["rounded_errs"]])
        base = torch.finfo(getattr(torch, r["dtype"])).eps / 64
        r["fail_rounded_base"] = bool(r["err"] > r["k"] * e + base)


def summarize(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        _offline_verdicts(r)
    kinds = defaultdict(list)
    for r in rows:
        kinds["module" if "module" in r["test"] else "ops"].append(r)
    for kind, rs in sorted(kinds.items()):
        examples = {(r["test"], r["example"]) for r in rs}
        for rule in ("base", "composite", "rounded_base", "applied"):
            bad = [r for r in rs if r.get(f"fail_{rule}")]
            bad_ex = {(r["test"], r["example"]) for r in bad}
            lines.append(
                f"{kind} [{rule} floor]: {len(bad_ex)} of {len(examples)} examples fail, "
                f"{len(bad)} of {len(rs)} tensors"
            )
            if not bad:
                continue
            ns = sorted(r["n"] for r in bad)
            larger = [r for r in rs if r["n"] > ns[-1]]
            lines.append(
                f"  failing tensors' elements {ns[0]}..{ns[-1]} (median {ns[len(ns) // 2]}); "
                f"tensors with more elements: {len(larger)}, failing 0"
            )
            lines.append(
                "  by tensor: "
                + ", ".join(f"{t} {c}" for t, c in Counter(r["tensor"] for r in bad).most_common())
            )
            lines.append(
                "  by dtype: "
                + ", ".join(f"{t} {c}" for t, c in Counter(r["dtype"] for r in bad).most_common())
            )
            ratios = sorted(r["ratio_base"] for r in bad)
            lines.append(
                f"  ratio (per-dtype floor) {ratios[0]:.2f}..{ratios[-1]:.2f}, median "
                f"{ratios[len(ratios) // 2]:.2f}"
            )
            for key in ("ulps_needed", "ulps_needed_rel"):
                need = [r[key] for r in bad if r[key] is not None]
                if need:
                    lines.append(f"  {key}: max {max(need):.2f}")
        lines.append("  by elements: tensors, failing the per-dtype floor, ulps the worst needs")
        for lo, hi in BUCKETS:
            inside = [r for r in rs if lo <= r["n"] < hi]
            bad = [r for r in inside if r["fail_base"]]
            need = max((r["ulps_needed"] or 0.0 for r in bad), default=0.0)
            share = 100 * len(bad) / max(1, len(inside))
            lines.append(
                f"    {lo}..{hi - 1 if hi < 1 << 62 else ''}: {len(inside)}, {len(bad)} "
                f"({share:.2f}%), {need:.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    rows = []
    for name in sorted(os.listdir(argv[0])):
        if name.endswith(".jsonl"):
            with open(os.path.join(argv[0], name)) as f:
                rows += [json.loads(line) for line in f]
    print(summarize(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
