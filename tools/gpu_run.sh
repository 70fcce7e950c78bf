#!/usr/bin/env bash
# One call on a GPU machine: environment, a timed build, the given pytest run (through the report
# tool), optionally compute-sanitizer's four tools over every kernel path and the module
# (tools/sanitize/run.sh, beside the pytest run), ncu on the standing kernel list
# (tools/gpu/ncu_softmax.py --table into $OUT/ncu.txt) and the benchmark (with the performance issue's
# targets checked on its run: $OUT/targets.md); every log lands in $OUT (default ./gpu_out), and
# on exit all of them in $OUT/all.tar.gz as well. With TE_SRC set or a .te_src folder, TE's own
# fused softmax kernels are built too (tools/te_kernels/build.py) before the suites and benchmark.
# Exits non-zero when any step failed (unmet targets are not a failed step).
#   tools/gpu_run.sh [--sanitize] [--ncu] [--bench] [--timeout S] [--] [python -m te_conformance run args]
# --timeout S stops the pytest run after S seconds (SIGTERM): the report then holds the cases that
# finished, marked partial, and the step fails; the steps after it still run.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
bench=0
ncu=0
sanitize=0
limit=()  # the pytest run's time limit (--timeout)
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) bench=1; shift ;;
    --ncu) ncu=1; shift ;;
    --sanitize) sanitize=1; shift ;;
    --timeout)
      [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_run: --timeout takes seconds" >&2; exit 2; }
      limit=(timeout "$2"); shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
failed=""  # the steps that failed; the exit code is the benchmark's own when only it failed
final=0

# The device returns at most 8 files from $OUT (on 2026-12-05 the top-level ones came first, by
# name, then those in folders): on exit every file also goes into one archive named to sort
# first, $OUT/all.tar.gz, so that report/report.json, the sanitizers' logs and the benchmark's
# files come back with it.
bundle() {
  local tmp
  tmp=$(mktemp /tmp/gpu_run_all.XXXXXX) || return
  tar -czf "$tmp" -C "$OUT" --exclude=all.tar.gz . && mv "$tmp" "$OUT/all.tar.gz"
  rm -f "$tmp"
}
trap bundle EXIT

CC0=${CC:-} CXX0=${CXX:-}  # as given, for env.txt
# shellcheck source=tools/gpu/env.sh
. "$(dirname "$(readlink -f "$0")")/gpu/env.sh"
gpu_env /tmp/site  # the carried wheels; the distribution's g++ (see tools/gpu/env.sh)

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"
  $PY -m pip list 2>/dev/null | grep -i -E "^(torch|pytest|pytest-xdist|matplotlib|numpy|ninja|expecttest|hypothesis) "
  $PY -c "import hypothesis; print('hypothesis', hypothesis.__version__)" 2>&1 | tail -1
  command -v ninja nvcc compute-sanitizer
  echo "CC=$CC0 CXX=$CXX0 (given), CC=${CC:-} CXX=${CXX:-} (used)"; ${CXX0:-g++} --version | head -1
  /usr/bin/g++ --version 2>&1 | head -1
  file -L "${CXX0:-/usr/bin/g++}" 2>/dev/null
  head -c 400 "${CXX0:-/dev/null}" 2>/dev/null | strings | head -5
  nproc
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

start=$(date +%s%N)
MAX_JOBS=$(nproc) $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1
rc=$?
build_s=$(( ($(date +%s%N) - start) / 1000000 ))
echo "build: exit $rc in ${build_s} ms (MAX_JOBS=$(nproc), TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-auto})" | tee "$OUT/build_time.txt"
grep -E "warning|error" "$OUT/build.log" | grep -v "Wc++20\|bit-fields" | head -20
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit $rc; }
# An argument error must come back as a Python exception (a toolchain mismatch can turn the
# C++ throw into a crash): try it in a subprocess, and on a crash rebuild with the system g++.
error_path() {
  $PY -c "import torch, te_fast
try:
    te_fast.ops.scaled_softmax(torch.ones(2, 2), 1.0)
except RuntimeError as e:
    print('error path ok:', str(e)[:60])" 2>&1 | tail -1
}
if ! error_path | grep -q "error path ok"; then
  echo "error path crashed with CXX=${CXX:-default}; $(${CXX:-g++} --version | head -1)" | tee -a "$OUT/build_time.txt"
  rm -rf build te_fast/_C*.so
  CC=/usr/bin/gcc CXX=/usr/bin/g++ MAX_JOBS=$(nproc) $PY setup.py build_ext --inplace > "$OUT/build2.log" 2>&1
  echo "rebuilt with $(/usr/bin/g++ --version | head -1): $(error_path)" | tee -a "$OUT/build_time.txt"
fi
# A GPU machine whose te_fast lacks CUDA kernels would skip every CUDA case: a failed step.
if ! $PY -c "import sys, te_fast
reason = te_fast.device_unavailable_reason('cuda')
print('te_fast CUDA:', reason or 'ok')
sys.exit(1 if reason else 0)"; then
  failed+=" te_fast_cuda"; final=1
fi

# Transformer Engine's own fused softmax kernels for the `te` peer and suites/te_fast/test_te_kernels.py
# (docs/te_kernels.md), when TE's sources came along: $TE_SRC, or the ignored .te_src folder
# carried with the working tree. Without them the te peer and suite skip with the reason.
te_src=${TE_SRC:-}
[ -z "$te_src" ] && [ -d .te_src ] && te_src=$PWD/.te_src
if [ -n "$te_src" ]; then
  start=$(date +%s%N)
  TE_SRC=$te_src $PY tools/te_kernels/build.py build --cxx /usr/bin/g++ \
    --nvcc "${CUDA_HOME:+$CUDA_HOME/bin/}nvcc" > "$OUT/te_kernels_build.log" 2>&1
  rc=$?
  echo "te_kernels build: exit $rc in $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$OUT/build_time.txt"
  [ $rc -eq 0 ] || { tail -30 "$OUT/te_kernels_build.log"; failed+=" te_kernels"; final=1; }
else
  echo "te_kernels: no TE sources (TE_SRC unset, no .te_src): the te peer and suite skip"
fi

if [ $sanitize -eq 1 ]; then
  # its own processes (PYTORCH_NO_CUDA_MEMORY_CACHING=1), beside the pytest run below
  PYTHON=$PY tools/sanitize/run.sh "$OUT/sanitize" > "$OUT/sanitize.log" 2>&1 &
  sanitize_pid=$!
  echo "sanitize: compute-sanitizer ${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck} started (logs in $OUT/sanitize)"
fi
if [ $# -gt 0 ]; then
  "${limit[@]}" $PY -m te_conformance run --out "$OUT/report" "$@" 2>&1 | tee "$OUT/pytest.log" | grep -v -E "^\.|^s|PASSED|SKIPPED" | tail -60
  pytest_rc=${PIPESTATUS[0]}
  echo "te_conformance run: exit $pytest_rc (0 pass, 1 failures or regressions, 2 baseline problem or stopped early, 124 --timeout)"
  [ "$pytest_rc" -eq 0 ] || { failed+=" pytest"; final=1; }
fi
if [ $sanitize -eq 1 ]; then
  wait "$sanitize_pid"
  sanitize_rc=$?
  cat "$OUT/sanitize.log"
  [ "$sanitize_rc" -eq 0 ] || { failed+=" sanitize"; final=1; }
fi
if [ $ncu -eq 1 ]; then
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 420 $PY tools/gpu/ncu_softmax.py --table 2>&1 | tee "$OUT/ncu.txt"
fi
if [ $bench -eq 1 ]; then
  # one line per result as it goes (also in bench.log); the summary and any WRONG/ERROR last
  rm -f "$OUT/bench/latest.json"  # the targets below read this run's, or none
  $PY -m benchmarks --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
  bench_rc=${PIPESTATUS[0]}
  echo "benchmarks: exit $bench_rc (0 ok, 1 WRONG/ERROR rows, 2 cannot run here, 3 stopped)"
  # the performance issue's targets on this run (met / NOT met / incomplete; not a failed step)
  if [ -f "$OUT/bench/latest.json" ]; then
    if $PY -m benchmarks targets "$OUT/bench/latest.json" > "$OUT/targets.md" 2>&1; then
      echo "targets: all met ($OUT/targets.md)"
    else
      echo "targets: not all met ($OUT/targets.md)"
    fi
  fi
  [ "$bench_rc" -eq 0 ] || { failed+=" bench"; [ "$final" -ne 0 ] || final=$bench_rc; }
fi
if [ -n "$failed" ]; then
  echo "gpu_run: failed:$failed"
  exit "$final"
fi
echo "gpu_run: every step passed"
