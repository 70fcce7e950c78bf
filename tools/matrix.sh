#!/usr/bin/env bash
# Regenerate the conformance matrix picture, docs/matrix.png (with docs/matrix.json, .md, .html),
# from CPU runs of the four adapters, and record those runs compactly in docs/matrix_runs/
# (tests/test_reports_matrix.py checks that the committed picture is what they give).
#
#   tools/matrix.sh            run the four adapters one after the other, then draw
#   RUN=0 tools/matrix.sh      draw from the runs already in $OUT
#
# One subset for every adapter: the CPU cases of the conformance room (suites/conformance/, every
# test of which takes an adapter), less test_dynamic_shapes and the inductor compile variant (the
# slow parts of a flex_attention CPU run); 2 workers. The rows and which cases count for each are
# what the cases recorded (suites/features.py). Each run
# takes a few minutes on an idle 2-core machine, flex_attention the longest. transformer_engine
# needs a Python with Transformer Engine 2.20.2 (requirements-te.txt, as .ci/te.sh installs it):
# TE_PYTHON, default $PYTHON; without TE its run skips every case, and its column says so.
#
# Environment: PYTHON (default python), TE_PYTHON (default $PYTHON), OUT (default
# /tmp/matrix-runs), WORKERS (default 2), RUN (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
TE_PYTHON=${TE_PYTHON:-$PYTHON}
OUT=${OUT:-/tmp/matrix-runs}
WORKERS=${WORKERS:-2}
IMPLS=(te_fast torch.sdpa flex_attention transformer_engine)
SUITES=(suites/conformance)
SUBSET="not test_dynamic_shapes and not inductor"

if [ "${RUN:-1}" != 0 ]; then
  for impl in "${IMPLS[@]}"; do
    py=$PYTHON
    [ "$impl" = transformer_engine ] && py=$TE_PYTHON
    rc=0
    "$py" -m te_conformance run --impl "$impl" --out "$OUT/$impl" --no-compare -- \
      -n "$WORKERS" -q -p no:cacheprovider -m "not gpu" -k "$SUBSET" "${SUITES[@]}" || rc=$?
    # 0: every case passed or skipped; 1: some failed (the matrix shows them); else no report
    if [ "$rc" -gt 1 ]; then
      echo "tools/matrix.sh: the $impl run ended with exit code $rc" >&2
      exit "$rc"
    fi
  done
fi

runs=()
for impl in "${IMPLS[@]}"; do runs+=("$OUT/$impl/report.json"); done
rm -rf docs/matrix_runs
"$PYTHON" -m te_conformance matrix "${runs[@]}" --out docs --save-summaries docs/matrix_runs
