#!/usr/bin/env bash
# A/B of a kernel change in one GPU call: build A (this tree with BASE's csrc/) and B (this tree)
# side by side, compare their softmax outputs bit for bit (tools/softmax_bits.py), then run the
# benchmark on each, interleaved A B A B ..., and write the side-by-side table
# (python -m benchmarks ab). Everything lands in $OUT (default ./gpu_out): ab.md, bits.txt,
# ab.log, the builds' logs on failure.
#   tools/gpu_ab.sh BASE [--rounds N] [--no-bits] [-- benchmark arguments]
# BASE is a folder holding the base's csrc/, made here before the call and carried to the GPU
# machine (.ab_base is git-ignored):
#   rm -rf .ab_base && git archive --prefix=.ab_base/ HEAD csrc | tar -x
# Benchmark arguments default to the softmax section without peers or inductor
# (--only softmax --peers "" --inductor off); pass others after --, e.g.
#   tools/gpu_ab.sh .ab_base --rounds 2 -- --only softmax --peers "" --inductor off --sk 16384
# Exit: 0 done (the table says who won; outputs may differ: see bits.txt), 1 a build or a run
# failed, 2 bad arguments or no CUDA device.
# AB_DEVICE=cpu checks the plumbing on a machine without a GPU: CPU builds (TE_FAST_CUDA=0), the
# quick bits matrix and the benchmark's --smoke run (its timings mean nothing).
set -uo pipefail
SELF=$(readlink -f "$0")
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$SELF" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=${OUT:-$PWD/gpu_out}
[ -d "$1/csrc" ] || { echo "gpu_ab: $1/csrc is not a folder" >&2; usage; }
BASE=$(cd "$1" && pwd); shift
cd "$(dirname "$SELF")/.."
PY=${PYTHON:-python3}
rounds=2
bits=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --no-bits) bits=0; shift ;;
    --) shift; break ;;
    *) echo "gpu_ab: unknown argument $1" >&2; usage ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_ab: --rounds takes a positive count" >&2; exit 2; }
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--only softmax --peers "" --inductor off)
device=cuda
bits_args=(--device cuda)
if [ "${AB_DEVICE:-cuda}" = cpu ]; then  # the plumbing check (see above)
  device=cpu
  bits_args=(--device cpu --quick)
  bench_args=(--smoke)
  export TE_FAST_CUDA=0
elif ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
then
  echo "gpu_ab: no CUDA device here (an A/B runs on a GPU machine)" >&2
  exit 2
fi
mkdir -p "$OUT"
LOG=$OUT/ab.log
WORK=${AB_WORK:-/tmp/gpu_ab}
rm -rf "$WORK"; mkdir -p "$WORK"
if [ -d .whl ]; then  # wheels carried to a machine without a registry (as tools/gpu_run.sh)
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" .whl/*.whl \
    && export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
fi
# The distribution's g++ where it exists (see tools/gpu_run.sh); half the cores to each build.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
jobs=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
rel=${BASE#"$PWD"/}  # BASE's path in the tree (not copied into either build), when inside it
for v in A B; do  # the sources, without build outputs, environments, caches or scratch
  mkdir -p "$WORK/$v"
  tar --exclude=./.git --exclude=./.whl --exclude=./build --exclude=./gpu_out --exclude="./$rel" \
    --exclude=./.venv --exclude=./.ci-venv --exclude=./reports/latest --exclude=./devscratch \
    --exclude=./.hypothesis --exclude=__pycache__ --exclude='*.so' -cf - . | tar -xf - -C "$WORK/$v"
done
rm -rf "$WORK/A/csrc" && cp -r "$BASE/csrc" "$WORK/A/csrc"
echo "gpu_ab: $(date -u), $device, base $BASE, $rounds rounds, benchmark ${bench_args[*]}" \
  | tee "$LOG"
start=$(date +%s)
for v in A B; do
  (cd "$WORK/$v" && MAX_JOBS=$jobs $PY setup.py build_ext --inplace > "$WORK/build_$v.log" 2>&1;
   echo $? > "$WORK/build_$v.rc") &
done
wait
for v in A B; do
  if [ "$(cat "$WORK/build_$v.rc")" != 0 ]; then
    tail -40 "$WORK/build_$v.log" > "$OUT/build_$v.log"
    echo "gpu_ab: build $v failed (tail in $OUT/build_$v.log)" | tee -a "$LOG"
    exit 1
  fi
done
echo "gpu_ab: both built in $(( $(date +%s) - start )) s" | tee -a "$LOG"
failed=0
if [ $bits -eq 1 ]; then
  for v in A B; do
    (cd "$WORK/$v" && PYTHONPATH=$WORK/$v${PYTHONPATH:+:$PYTHONPATH} \
      $PY tools/softmax_bits.py save "$WORK/bits_$v.json" "${bits_args[@]}" >> "$LOG" 2>&1) \
      || { echo "gpu_ab: softmax_bits save failed on $v" | tee -a "$LOG"; failed=1; }
  done
  $PY tools/softmax_bits.py compare "$WORK/bits_A.json" "$WORK/bits_B.json" > "$OUT/bits.txt" 2>&1
  echo "gpu_ab: bits: $(head -1 "$OUT/bits.txt")" | tee -a "$LOG"
fi
runs=()
for r in $(seq 1 "$rounds"); do
  for v in A B; do
    if (cd "$WORK/$v" && PYTHONPATH=$WORK/$v${PYTHONPATH:+:$PYTHONPATH} \
        $PY -m benchmarks --out "$WORK/bench_$v$r" "${bench_args[@]}" > "$WORK/bench_$v$r.log" 2>&1); then
      echo "gpu_ab: benchmark $v$r done" | tee -a "$LOG"
    else
      echo "gpu_ab: benchmark $v$r exit $? (tail below)" | tee -a "$LOG"
      tail -5 "$WORK/bench_$v$r.log" >> "$LOG"
      failed=1
    fi
    [ -f "$WORK/bench_$v$r/latest.json" ] && runs+=("$v$r=$WORK/bench_$v$r/latest.json")
  done
done
if [ ${#runs[@]} -gt 0 ]; then
  $PY -m benchmarks ab "${runs[@]}" > "$OUT/ab.md" 2>> "$LOG" || failed=1
  echo "gpu_ab: table in $OUT/ab.md (${#runs[@]} runs)" | tee -a "$LOG"
fi
exit $failed
