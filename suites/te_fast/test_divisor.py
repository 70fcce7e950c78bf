"""csrc/cuda/divisor.h: the forward kernels' row / sq and row / (heads * sq) by a multiply and a
shift. The header is plain C++ off the GPU (the device build swaps in __umulhi/__umul64hi for the
same products), so its host build is compiled here with the system C++ compiler and checked
against Python's integer division: both forms (32 and 64 bits), divisors from 1 to near 2^63,
dividends at 0, d - 1, d, d + 1, the multiples around the largest, the range's end and random.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from te_conformance.suites import skips

ROOT = Path(__file__).resolve().parents[2]  # the checkout: suites/te_fast/ -> ..
MAX32 = 2**31 - 1  # kMaxDivisor32
MAX64 = 2**63 - 1

PROGRAM = r"""
#include <cstdint>
#include <cstdio>
#include "cuda/divisor.h"
// stdin: lines "d n"; stdout: "q32 q64" (q32 -1 where the 32-bit form does not apply).
int main() {
  unsigned long long d, n;
  while (std::scanf("%llu %llu", &d, &n) == 2) {
    const auto div = te_fast_kernels::make_divisor(static_cast<int64_t>(d));
    long long q32 = -1;
    if (d <= te_fast_kernels::kMaxDivisor32 && n <= te_fast_kernels::kMaxDivisor32) {
      q32 = te_fast_kernels::divide(static_cast<uint32_t>(n), div);
    }
    const unsigned long long q64 = te_fast_kernels::divide(static_cast<uint64_t>(n), div);
    std::printf("%lld %llu\n", q32, q64);
  }
  return 0;
}
"""


def _cases() -> list[tuple[int, int]]:
    rng = random.Random(2026)
    divisors = set(range(1, 300))
    for k in range(1, 63):
        divisors.update({2**k - 1, 2**k, 2**k + 1})
    divisors.update(rng.randrange(1, MAX32 + 1) for _ in range(300))
    divisors.update(rng.randrange(1, MAX64 + 1) for _ in range(300))
    divisors = sorted(d for d in divisors if 1 <= d <= MAX64)
    cases = []
    for d in divisors:
        top = MAX32 if d <= MAX32 else MAX64
        ns = {0, 1, d - 1, d, d + 1, MAX32, MAX64, top, top - 1}
        ns.update((top // d) * d + o for o in (-1, 0, 1))
        ns.update(rng.randrange(0, top + 1) for _ in range(4))
        ns.update(rng.randrange(0, MAX64 + 1) for _ in range(2))
        cases += [(d, n) for n in sorted(ns) if 0 <= n <= MAX64]
    return cases


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        skips.skip("environment", ["no C++ compiler (c++, g++ or clang++) on PATH"])
    if not (ROOT / "csrc" / "cuda" / "divisor.h").is_file():
        skips.skip("environment", [f"no csrc/cuda/divisor.h under {ROOT}: the suites are "
                                   "installed without te_fast's sources (run from a checkout)"])
    work = tmp_path_factory.mktemp("divisor")
    (work / "check.cpp").write_text(PROGRAM)
    exe = work / "check"
    subprocess.run(
        [cxx, "-std=c++17", "-O1", f"-I{ROOT / 'csrc'}", str(work / "check.cpp"), "-o", str(exe)],
        check=True,
        capture_output=True,
    )
    return exe


def test_divide_matches_integer_division(program):
    cases = _cases()
    text = "".join(f"{d} {n}\n" for d, n in cases)
    out = subprocess.run([program], input=text, capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == len(cases)
    checked32 = 0
    for (d, n), line in zip(cases, lines):
        q32, q64 = (int(v) for v in line.split())
        assert q64 == n // d, f"64-bit form: {n} / {d} gave {q64}, not {n // d}"
        if d <= MAX32 and n <= MAX32:
            assert q32 == n // d, f"32-bit form: {n} / {d} gave {q32}, not {n // d}"
            checked32 += 1
        else:
            assert q32 == -1
    assert checked32 > 1000 and len(cases) - checked32 > 1000
