#!/usr/bin/env bash
# A second outside adapter, with declared differences: examples/hf_sdpa (Hugging Face
# transformers' sdpa_attention_forward, as an HF model calls it) installed with its pinned
# transformers into the CI venv and gated from a directory outside the checkout like
# examples/my_attention (.ci/example_adapter.sh): a first run without a baseline must say NO
# BASELINE and exit 0, a second recording one must say PASS and exit 0, the printed verdict and
# the exit code agreeing each time. The subset holds the adapter's declared differences (one-token
# top-left decode, fully masked rows, the CPU flash kernel's exact zeros), which must show as
# strict expected failures (xfailed) recorded with their source. ~2 min on 2 cores.
#   usage: .ci/hf_example.sh [PYTHON]   (default: .ci-venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
py=${1:-$( [ -x .ci-venv/bin/python ] && echo "$repo/.ci-venv/bin/python" || command -v python3 )}
subset="(test_core or test_alignment or test_decode) and cpu and fp32 and bshd_bshd_bshd"

if ! "$py" -c "import suites.plugin, te_fast" 2>/dev/null; then
  "$py" -m pip install -q --no-build-isolation -e "$repo[test,report]"
fi
# not editable: the entry point must come from an installed distribution's metadata; with its
# dependencies: transformers==4.57.6 as the package pins it
"$py" -m pip install -q --no-build-isolation "$repo/examples/hf_sdpa"
work=$(mktemp -d)
trap '"$py" -m pip uninstall -q -y hf-sdpa-conformance; rm -rf "$work"' EXIT
cd "$work"  # no conftest.py, pyproject.toml or suites/ of the checkout here

gate() {  # gate EXPECTED_VERDICT EXPECTED_EXIT [reports run arguments...]
  local want=$1 want_rc=$2 rc=0
  shift 2
  "$py" -m reports run --impl hf_sdpa --machine-class cpu --out out "$@" -- -k "$subset" \
    >log.txt 2>&1 || rc=$?
  local verdict
  verdict=$(grep -A1 "TE conformance verdict" log.txt | tail -1)
  echo "reports run $*: verdict $verdict, exit $rc"
  if [ "$verdict" != "$want" ] || [ "$rc" != "$want_rc" ] \
     || { [ "$verdict" = PASS ] && [ "$rc" != 0 ]; } || { [ "$verdict" = FAIL ] && [ "$rc" = 0 ]; }; then
    tail -40 log.txt
    echo "hf_sdpa example: expected verdict $want with exit $want_rc" >&2
    exit 1
  fi
  # the declared differences ran as strict expected failures, recorded with their declaration
  "$py" - out/report.json <<'PY'
import json
import sys

report = json.load(open(sys.argv[1]))
cases = {c["nodeid"]: c for c in report["cases"]}
want = {
    "test_decode[bshd_bshd_bshd-fp32-causal-gqa2-cross1x22-cpu-hf_sdpa]": "one query token",
    "test_alignment[bshd_bshd_bshd-fp32-arbitrary-cpu-hf_sdpa]": "fully masked rows",
    "test_alignment[bshd_bshd_bshd-fp32-no_mask-one_token-cpu-hf_sdpa]": "flash-attention",
}
for name, reason in want.items():
    case = cases[f"suites/test_attention.py::{name}"]
    assert case["outcome"] == "xfailed", (name, case["outcome"])
    declared = [e for e in case["expected"] if e.get("source") == "declared"]
    assert any(e["adapter"] == "hf_sdpa" and reason in e["reason"] and
               e["defined_at"].startswith("hf_sdpa/adapter.py:") for e in declared), (name, case)
passed = sum(c["outcome"] == "passed" for c in cases.values())
xfailed = sum(c["outcome"] == "xfailed" for c in cases.values())
assert passed >= 20 and xfailed >= 10, (passed, xfailed)
print(f"hf_sdpa: {passed} passed, {xfailed} xfailed as declared differences")
PY
}

gate "NO BASELINE" 0             # no baseline yet: reports/baseline/cpu.hf_sdpa.json
gate PASS 0 --update-baseline     # records it (every case passed, skipped or xfailed as declared)
test -f reports/baseline/cpu.hf_sdpa.json
echo "hf_sdpa example: OK"
