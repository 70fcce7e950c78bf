#!/usr/bin/env bash
# The third-party route, end to end: install the project and examples/my_attention (a package of
# its own declaring a te_conformance.adapters entry point) into the CI venv, then gate it from a
# directory outside the checkout with `python -m reports run --impl my_attention`, twice: without
# a baseline (a first run: must say NO BASELINE and exit 0, every case having passed or skipped),
# then recording one (must say PASS and exit 0). Each time
# the printed verdict and the exit code must agree. ~1 min on 2 cores.
#   usage: .ci/example_adapter.sh [PYTHON]   (default: .ci-venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
py=${1:-$( [ -x .ci-venv/bin/python ] && echo "$repo/.ci-venv/bin/python" || command -v python3 )}
subset="test_core and cpu and fp32 and (bshd_bshd_bshd or sbh3d or thd_thd_thd)"

if ! "$py" -c "import suites.plugin, te_fast" 2>/dev/null; then
  "$py" -m pip install -q --no-build-isolation -e "$repo[test,report]"
fi
# not editable: the entry point must come from an installed distribution's metadata
"$py" -m pip install -q --no-build-isolation --no-deps "$repo/examples/my_attention"
work=$(mktemp -d)
trap '"$py" -m pip uninstall -q -y my-attention; rm -rf "$work"' EXIT
cd "$work"  # no conftest.py, pyproject.toml or suites/ of the checkout here

gate() {  # gate EXPECTED_VERDICT EXPECTED_EXIT [reports run arguments...]
  local want=$1 want_rc=$2 rc=0
  shift 2
  "$py" -m reports run --impl my_attention --machine-class cpu --out out "$@" -- -k "$subset" >log.txt 2>&1 || rc=$?
  local verdict
  verdict=$(grep -A1 "TE conformance verdict" log.txt | tail -1)
  echo "reports run $*: verdict $verdict, exit $rc"
  if [ "$verdict" != "$want" ] || [ "$rc" != "$want_rc" ] \
     || { [ "$verdict" = PASS ] && [ "$rc" != 0 ]; } || { [ "$verdict" = FAIL ] && [ "$rc" = 0 ]; }; then
    tail -40 log.txt
    echo "example adapter: expected verdict $want with exit $want_rc" >&2
    exit 1
  fi
  # the adapter ran: its cases are in the report under its name, from the installed suites
  grep -q "test_attention.py::test_core\[bshd_bshd_bshd-fp32-causal-cpu-my_attention\]" \
    out/report.json
}

gate "NO BASELINE" 0             # no baseline yet: reports/baseline/cpu.my_attention.json
gate PASS 0 --update-baseline     # records it (every case passed or skipped with its reason)
test -f reports/baseline/cpu.my_attention.json
echo "example adapter: OK"
