"""Kept for old callers: `python -m benchmarks.bench_ops ARGS` runs `python -m benchmarks ARGS`."""

from __future__ import annotations

import sys

from benchmarks.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
