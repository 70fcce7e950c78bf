#!/usr/bin/env bash
# CI step: Transformer Engine 2.20.2's own Python judged by the conformance suites on the CPU
# (docs/transformer_engine.md). Extends the CI venv (.ci-venv, made by .ci/run; made here when
# run alone) with requirements-te.txt, checks that TE loads through the CPU stand-in
# (suites/adapters/te_cpu_standin.py), then runs the adapter suites with --impl transformer_engine.
# Every case must pass, skip with a reason, or fail as a recorded TE deviation / the fallback
# outcome (strict xfail, suites/te_deviations.py); anything else fails this step. ~1 GB of
# downloads (triton) on a cold cache; the suites take a few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.ci-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q torch==2.13.0 ninja
  "$VENV/bin/python" -m pip install -q --no-build-isolation -e ".[test,report]"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q -r requirements-te.txt

# TE must load, and on this CPU machine through the stand-in (never a silent skip of it all)
python - <<'PY'
from te_conformance.suites.adapters import transformer_engine as adapter
te, missing = adapter.load()
assert te is not None, missing
assert adapter.stand_in(), "expected the CPU stand-in on a machine without CUDA"
print(f"transformer_engine {adapter.te_version()} through the CPU stand-in")
PY

# the reproducers print TE's grid next to the documented one (and fail if TE cannot run them)
python -m te_conformance.suites.te_deviations >/tmp/te_deviations.txt

# TE_SUITES: the suites run against TE here (docs/transformer_engine.md says why these)
TE_SUITES=${TE_SUITES:-"suites/conformance/test_attention.py suites/conformance/test_semantics.py suites/conformance/test_semantics_values.py suites/conformance/test_dropout.py suites/conformance/test_compile.py"}
python -m pytest -p no:cacheprovider -q tests/test_te_adapter.py
# the report of the TE run (reports/latest/te/: its "TE deviations" section); no baseline gate:
# the verdict is its test outcomes (an unexplained failure fails), and te_fast's own verdict
# (python -m te_conformance run) does not depend on TE being installed
# shellcheck disable=SC2086
python -m te_conformance run --impl transformer_engine --no-compare --out reports/latest/te \
  -- -m "not gpu" -p no:cacheprovider -n 2 -q $TE_SUITES
