#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck, initcheck and synccheck over tools/sanitize/ops.py
# --module (every kernel path of the ops, and the module's forward and backward), the four tools
# side by side (one process each); one summary line per tool; exit 1 on any finding, a tool
# that did not finish, or a driver that failed.
#   tools/sanitize/run.sh OUTDIR
# Environment (defaults): PYTHON (python3), SANITIZER (compute-sanitizer), SANITIZE_TOOLS
# ("memcheck racecheck initcheck synccheck"), SANITIZE_TIMEOUT (360 s per tool), SANITIZE_JOBS
# (4: tools at once), SANITIZE_TE_FAST_ONLY (0; 1: every tool checks te_fast's kernels only;
# racecheck always does, and runs the driver's --reduced list: it is ~100x slower),
# SANITIZE_DEVICE (cuda), SANITIZE_DRIVER_ARGS (more driver arguments).
set -uo pipefail
OUTDIR=${1:?usage: tools/sanitize/run.sh OUTDIR}
cd "$(dirname "$0")/../.."
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
SANITIZER=${SANITIZER:-compute-sanitizer}
TOOLS=${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
TIMEOUT=${SANITIZE_TIMEOUT:-360}
JOBS=${SANITIZE_JOBS:-4}
DEVICE=${SANITIZE_DEVICE:-cuda}
export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # every tensor its own allocation: overruns are visible
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TE_FAST_DEBUG_CHECKS  # bad cu_seqlens must reach the kernels (which poison, never overrun)

if ! command -v "$SANITIZER" >/dev/null; then
  echo "sanitize: $SANITIZER not found" | tee "$OUTDIR/summary.txt"
  exit 1
fi
"$SANITIZER" --version 2>&1 | tail -1 > "$OUTDIR/version.txt"

run_tool() {  # tool index
  local tool=$1 port=$((49152 + 16 * $2))
  local filter=() driver=(--module --device "$DEVICE")
  if [ "$tool" = racecheck ] || [ "${SANITIZE_TE_FAST_ONLY:-0}" = 1 ]; then
    filter=(--kernel-name kns=te_fast_kernels)
  fi
  [ "$tool" = racecheck ] && driver+=(--reduced)
  # shellcheck disable=SC2086
  timeout --kill-after=20 "$TIMEOUT" "$SANITIZER" --tool "$tool" --error-exitcode 1 \
    --print-limit 100 --port "$port" --log-file "$OUTDIR/$tool.log" "${filter[@]}" \
    "$PY" tools/sanitize/ops.py "${driver[@]}" ${SANITIZE_DRIVER_ARGS:-} \
    > "$OUTDIR/$tool.out" 2>&1
  echo $? > "$OUTDIR/$tool.rc"
}

start=$(date +%s)
i=0
for tool in $TOOLS; do
  rm -f "$OUTDIR/$tool.rc" "$OUTDIR/$tool.log" "$OUTDIR/$tool.out"
  run_tool "$tool" "$i" &
  i=$((i + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
done
wait
echo "sanitize: $TOOLS in $(($(date +%s) - start)) s ($(cat "$OUTDIR/version.txt"))" \
  > "$OUTDIR/summary.txt"
# shellcheck disable=SC2086
"$PY" tools/sanitize/summary.py "$OUTDIR" --timeout "$TIMEOUT" $TOOLS >> "$OUTDIR/summary.txt"
rc=$?
cat "$OUTDIR/summary.txt"
exit $rc
