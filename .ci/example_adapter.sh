#!/usr/bin/env bash
# The third-party route, end to end, for one of the example packages: install the project and
# examples/EXAMPLE (a package of its own declaring a te_conformance.adapters entry point) into the
# CI venv, then gate it from a directory outside the checkout with `python -m te_conformance run --impl
# EXAMPLE`, twice: without a baseline (a first run: must say NO BASELINE and exit 0, every case
# having passed, skipped or failed as a declared difference), then recording one (must say PASS
# and exit 0). Each time the printed verdict and the exit code must agree, and the cases must be
# in the report under the adapter's name.
#   my_attention: a plain torch composite (~1 min on 2 cores).
#   hf_sdpa: Hugging Face transformers' sdpa_attention_forward with its pinned transformers,
#     whose declared differences (one-token top-left decode, fully masked rows, the CPU flash
#     kernel's exact zeros) must show as expected failures recorded with their declaration
#     (~1.5 min).
#   usage: .ci/example_adapter.sh EXAMPLE [PYTHON]   (default: .ci-venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
example=${1:?"usage: .ci/example_adapter.sh my_attention|hf_sdpa [PYTHON]"}
py=${2:-$( [ -x .ci-venv/bin/python ] && echo "$repo/.ci-venv/bin/python" || command -v python3 )}
case "$example" in
  my_attention)
    dist=my-attention
    install=(--no-deps)  # torch only, already there
    subset="test_core and cpu and fp32 and (bshd_bshd_bshd or sbh3d or thd_thd_thd)" ;;
  hf_sdpa)
    dist=hf-sdpa-conformance
    install=()  # with its dependencies: transformers==4.57.6 as the package pins it
    subset="(test_core or test_alignment or test_decode) and cpu and fp32 and bshd_bshd_bshd" ;;
  *) echo "example_adapter: unknown example $example (my_attention, hf_sdpa)" >&2; exit 2 ;;
esac

if ! "$py" -c "import te_conformance.suites.plugin, te_fast" 2>/dev/null; then
  "$py" -m pip install -q --no-build-isolation -e "$repo[test,report]"
fi
# not editable: the entry point must come from an installed distribution's metadata
"$py" -m pip install -q --no-build-isolation "${install[@]}" "$repo/examples/$example"
work=$(mktemp -d)
trap '"$py" -m pip uninstall -q -y "$dist"; rm -rf "$work"' EXIT
cd "$work"  # no conftest.py, pyproject.toml or suites/ of the checkout here

gate() {  # gate EXPECTED_VERDICT EXPECTED_EXIT [te_conformance run arguments...]
  local want=$1 want_rc=$2 rc=0
  shift 2
  "$py" -m te_conformance run --impl "$example" --machine-class cpu --out out "$@" -- -k "$subset" \
    >log.txt 2>&1 || rc=$?
  local verdict
  verdict=$(grep -A1 "TE conformance verdict" log.txt | tail -1)
  echo "te_conformance run --impl $example $*: verdict $verdict, exit $rc"
  if [ "$verdict" != "$want" ] || [ "$rc" != "$want_rc" ] \
     || { [ "$verdict" = PASS ] && [ "$rc" != 0 ]; } || { [ "$verdict" = FAIL ] && [ "$rc" = 0 ]; }; then
    tail -40 log.txt
    echo "$example example: expected verdict $want with exit $want_rc" >&2
    exit 1
  fi
  # the adapter ran: its cases are in the report under its name, from the installed suites; an
  # example's declared differences ran as expected failures, recorded with their declaration
  EXAMPLE=$example "$py" - out/report.json <<'PY'
import json
import os
import sys

example = os.environ["EXAMPLE"]
report = json.load(open(sys.argv[1]))
cases = {c["nodeid"]: c for c in report["cases"]}
ran = [c for c in cases.values() if c["adapter"] == example and c["outcome"] == "passed"]
assert f"suites/conformance/test_attention.py::test_core[bshd_bshd_bshd-fp32-causal-cpu-{example}]" in cases
assert len(ran) >= 5, len(ran)  # my_attention: 9 on its subset; hf_sdpa: 58
declared = {
    "hf_sdpa": {
        "test_decode[bshd_bshd_bshd-fp32-causal-gqa2-cross1x22-cpu-hf_sdpa]": "one query token",
        "test_alignment[bshd_bshd_bshd-fp32-arbitrary-cpu-hf_sdpa]": "fully masked rows",
        "test_alignment[bshd_bshd_bshd-fp32-no_mask-one_token-cpu-hf_sdpa]": "flash-attention",
    },
}.get(example, {})
# the flash kernel's one-key exact zeros sit at the bound's edge (a non-strict difference): an
# XPASS is recorded with its declaration too
loose = {"flash-attention"}
for name, reason in declared.items():
    case = cases[f"suites/conformance/test_attention.py::{name}"]
    allowed = ("xfailed", "xpassed") if reason in loose else ("xfailed",)
    assert case["outcome"] in allowed, (name, case["outcome"])
    mine = [e for e in case["expected"] if e.get("source") == "declared"]
    assert any(e["adapter"] == example and reason in e["reason"]
               and e["defined_at"].startswith(f"{example}/adapter.py:") for e in mine), (name, case)
xfailed = sum(c["outcome"] == "xfailed" for c in cases.values())
print(f"{example}: {len(ran)} passed, {xfailed} xfailed as declared differences")
PY
}

gate "NO BASELINE" 0             # no baseline yet: reports/baseline/cpu.EXAMPLE.json
gate PASS 0 --update-baseline     # records it
test -f "reports/baseline/cpu.$example.json"
echo "$example example: OK"
