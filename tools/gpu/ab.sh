#!/usr/bin/env bash
# A/B of kernel changes in one GPU call: build A (this tree with BASE's csrc/), B (this tree) and
# C, D, ... (this tree with each CANDIDATE's csrc/, in the order given) side by side, compare each
# build's softmax outputs with A's bit for bit (tools/gpu/softmax_bits.py), then run the benchmark on
# each, interleaved A B C ... A B C ..., and write the side-by-side table (python -m benchmarks
# ab). Everything lands in $OUT (default ./gpu_out): ab.md, bits.txt, ab.log, the builds' logs on
# failure.
#   tools/gpu/ab.sh BASE [CANDIDATE ...] [--rounds N] [--no-bits] [-- benchmark arguments]
# BASE and each CANDIDATE are folders holding a csrc/, made here before the call and carried to
# the GPU machine (.ab_base and .ab_* are git-ignored), e.g. HEAD's kernels against the tree and
# the tree with a patch applied:
#   rm -rf .ab_base && git archive --prefix=.ab_base/ HEAD csrc | tar -x
#   rm -rf .ab_x && cp -r .ab_base .ab_x && git apply --directory=.ab_x x.patch
# At most six candidates (builds C to H); the builds share the machine's cores.
# Benchmark arguments default to the softmax section without peers or inductor
# (--only softmax --peers "" --inductor off); pass others after --, e.g.
#   tools/gpu/ab.sh .ab_base --rounds 2 -- --only softmax --peers "" --inductor off --sk 16384
# Exit: 0 done (the table says who won; outputs may differ: see bits.txt), 1 a build or a run
# failed, 2 bad arguments or no CUDA device.
# AB_DEVICE=cpu checks the plumbing on a machine without a GPU: CPU builds (TE_FAST_CUDA=0), the
# quick bits matrix and the benchmark's --smoke run (its timings mean nothing).
set -uo pipefail
SELF=$(readlink -f "$0")
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$SELF" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=${OUT:-$PWD/gpu_out}
LETTERS=(A B C D E F G H)
srcs=()  # the csrc/ folders of A and of the candidates (C, D, ...); B is the tree's own
rounds=2
bits=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:-}; shift $(( $# > 1 ? 2 : 1 )) ;;
    --no-bits) bits=0; shift ;;
    --) shift; break ;;
    -*) echo "gpu_ab: unknown argument $1" >&2; usage ;;
    *)
      [ -d "$1/csrc" ] || { echo "gpu_ab: $1/csrc is not a folder" >&2; usage; }
      [ ${#srcs[@]} -lt 7 ] || { echo "gpu_ab: at most six candidates" >&2; exit 2; }
      srcs+=("$(cd "$1" && pwd)"); shift ;;
  esac
done
[ ${#srcs[@]} -ge 1 ] || { echo "gpu_ab: no BASE folder given" >&2; usage; }
cd "$(dirname "$SELF")/../.."
PY=${PYTHON:-python3}
builds=(A B)  # the build letters, and each one's csrc/ folder (B: none, the tree's)
declare -A src=([A]=${srcs[0]})
for ((i = 1; i < ${#srcs[@]}; i++)); do
  builds+=("${LETTERS[i + 1]}")
  src[${LETTERS[i + 1]}]=${srcs[i]}
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
# shellcheck source=tools/gpu/env.sh
. tools/gpu/env.sh
gpu_env "$WORK/site"  # the carried wheels; the distribution's g++ (see tools/gpu/env.sh)
jobs=$(( $(nproc) / ${#builds[@]} > 0 ? $(nproc) / ${#builds[@]} : 1 ))  # the cores, shared
excludes=()  # the folders given (not copied into any build) where they lie inside the tree
for s in "${srcs[@]}"; do [ "${s#"$PWD"/}" = "$s" ] || excludes+=("--exclude=./${s#"$PWD"/}"); done
for v in "${builds[@]}"; do  # the sources, without build outputs, environments, caches or scratch
  mkdir -p "$WORK/$v"
  tar --exclude=./.git --exclude=./.whl --exclude=./build --exclude=./gpu_out "${excludes[@]}" \
    --exclude=./.venv --exclude=./.ci-venv --exclude=./reports/latest --exclude=./devscratch \
    --exclude=./.hypothesis --exclude=__pycache__ --exclude='*.so' -cf - . | tar -xf - -C "$WORK/$v"
  if [ -n "${src[$v]:-}" ]; then
    rm -rf "$WORK/$v/csrc" && cp -r "${src[$v]}/csrc" "$WORK/$v/csrc"
  fi
done
{
  echo "gpu_ab: $(date -u), $device, $rounds rounds, benchmark ${bench_args[*]}"
  for v in "${builds[@]}"; do echo "  $v: ${src[$v]:-this tree}"; done
} | tee "$LOG"
start=$(date +%s)
for v in "${builds[@]}"; do
  (cd "$WORK/$v" && MAX_JOBS=$jobs $PY setup.py build_ext --inplace > "$WORK/build_$v.log" 2>&1;
   echo $? > "$WORK/build_$v.rc") &
done
wait
for v in "${builds[@]}"; do
  if [ "$(cat "$WORK/build_$v.rc")" != 0 ]; then
    tail -40 "$WORK/build_$v.log" > "$OUT/build_$v.log"
    echo "gpu_ab: build $v failed (tail in $OUT/build_$v.log)" | tee -a "$LOG"
    exit 1
  fi
done
echo "gpu_ab: ${#builds[@]} builds in $(( $(date +%s) - start )) s" | tee -a "$LOG"
failed=0
if [ $bits -eq 1 ]; then
  for v in "${builds[@]}"; do
    (cd "$WORK/$v" && PYTHONPATH=$WORK/$v${PYTHONPATH:+:$PYTHONPATH} \
      $PY tools/gpu/softmax_bits.py save "$WORK/bits_$v.json" "${bits_args[@]}" >> "$LOG" 2>&1) \
      || { echo "gpu_ab: softmax_bits save failed on $v" | tee -a "$LOG"; failed=1; }
  done
  : > "$OUT/bits.txt"
  for v in "${builds[@]:1}"; do  # each build against A: "X against A: softmax_bits: ..."
    { printf '%s against A: ' "$v"
      $PY tools/gpu/softmax_bits.py compare "$WORK/bits_A.json" "$WORK/bits_$v.json" 2>&1; } \
      > "$WORK/bits_$v.txt"
    cat "$WORK/bits_$v.txt" >> "$OUT/bits.txt"
    echo "gpu_ab: bits: $(head -1 "$WORK/bits_$v.txt")" | tee -a "$LOG"
  done
fi
runs=()
for r in $(seq 1 "$rounds"); do
  for v in "${builds[@]}"; do
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
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} $PY tools/gpu/ab_table.py "${runs[@]}" > "$OUT/ab.md" 2>> "$LOG" || failed=1
  echo "gpu_ab: table in $OUT/ab.md (${#runs[@]} runs)" | tee -a "$LOG"
fi
exit $failed
