#!/usr/bin/env bash
# The GPU records the round-2 review asks for, one device call per STEPS (the chapter-10 study's 28 processes took
# 203 s in all in the committed H100 run; the census has not yet run on a GPU: limit 240 s):
#
#   bash scripts/capture_review_records.sh [OUTDIR] [COMMIT]
#   STEPS=cures,checkpoint bash scripts/capture_review_records.sh [OUTDIR] [COMMIT]
#
# STEPS (default census,clocks) picks the steps, in this order:
#
#   census   chapter 7: the saved-tensor census of the benchmark's model (scripts/saved_tensor_census.py,
#            small and medium, contexts 256 and 512, batch 4, bf16 autocast, plain and checkpointed)
#            -> OUTDIR/ch07/saved_tensors.json (+ its provenance entry), OUTDIR/census_log.txt
#   clocks   chapter 10: the mixed-precision study run again, now with NVML's SM clock, power and
#            clock-event reasons during every timed run (gpuprof.studies.mixed_precision.run_study)
#            -> OUTDIR/ch10/clocks.json (+ its provenance entry), OUTDIR/clocks_log.txt
#   cures    chapter 10: the cures its profile points to (review 2, C10-19), fused AdamW and a compiled model with
#            fused AdamW, beside the chapter's own step, FP16 and BF16 at batches 32 and 128, two interleaved
#            rounds (gpuprof.studies.mixed_precision.cures_plan: 24 processes, 8 of them compiling; limit 480 s)
#            -> OUTDIR/ch10/cures.json (+ provenance), OUTDIR/cures_log.txt
#   checkpoint  chapter 7: the 2.7B model at context 1024, batch 4, bf16, plain and with each block checkpointed
#            (transformer_benchmark.py --checkpoint): the step's time, its phases and peak memory, model and
#            hardware FLOPs (limit 300 s) -> OUTDIR/ch07/checkpoint_{plain,each_block}.json (+ provenance),
#            OUTDIR/checkpoint_log.txt
#
# OUTDIR defaults to $OUT, else ./review_records. COMMIT (default $GPUPROF_GIT_COMMIT) is written into
# the provenance: the device machine's copy of the tree has no .git to read it from. Each step has a
# time limit; a failed step does not stop the other. Then copy each JSON into artifacts/ and merge its
# provenance entry (artifacts/<chapter>/provenance.json), as artifacts/capture_run.md records.
# Refuses (exit 2) where no NVIDIA GPU is visible: both records are the GPU's numbers.
set -u
case "${1:-}" in -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
OUTDIR=${1:-${OUT:-./review_records}}
export GPUPROF_GIT_COMMIT=${2:-${GPUPROF_GIT_COMMIT:-}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "error: no NVIDIA GPU visible here (nvidia-smi -L failed): both records are a GPU's numbers; run this on a GPU machine" >&2
  exit 2
fi
mkdir -p "$OUTDIR"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 GPUPROF_OUTPUT_DIR="$OUTDIR" GPUPROF_OVERWRITE=1
status=0
# study NAME LIMIT_S TAIL_LINES RUN TABLE: one chapter-10 study in Python (RUN binds 'found'; TABLE is printed rounded),
# its output in OUTDIR/NAME_log.txt, its last TAIL_LINES lines shown
study() {
  echo "[$1] $(date -u +%H:%M:%S)"
  timeout --kill-after=15 "$2" "$PY" -c "
from gpuprof.studies import mixed_precision as mp
$4
print(found.describe())
print(($5).round(3).to_string())
" > "$OUTDIR/$1_log.txt" 2>&1 || { echo "[$1] failed ($?): see $1_log.txt"; status=1; }
  tail -"$3" "$OUTDIR/$1_log.txt"
}
STEPS=",${STEPS:-census,clocks},"
case "$STEPS" in *,census,*)
echo "[census] $(date -u +%H:%M:%S)"
timeout --kill-after=15 240 "$PY" "$ROOT/scripts/saved_tensor_census.py" --sizes small,medium --contexts 256,512 \
  --batch-size 4 --mode bf16 --checkpoint both --record --json "$OUTDIR/saved_tensors_flat.json" \
  > "$OUTDIR/census_log.txt" 2>&1 || { echo "[census] failed ($?): see census_log.txt"; status=1; }
tail -25 "$OUTDIR/census_log.txt" ;; esac
case "$STEPS" in *,clocks,*)
study clocks 420 12 "found = mp.run_study('ch10', 'clocks.json')" "mp.clock_speedups(found.json())" ;; esac
case "$STEPS" in *,cures,*)
study cures 480 16 "found = mp.run_study('ch10', 'cures.json', plan=mp.cures_plan())" "mp.cures_table(found.json())" ;; esac
case "$STEPS" in *,checkpoint,*)
echo "[checkpoint] $(date -u +%H:%M:%S)"
mkdir -p "$OUTDIR/ch07"
for variant in plain each_block; do
  flag=""; [ "$variant" = each_block ] && flag="--checkpoint"
  args="--size 2.7B --context-length 1024 --batch-size 4 --dtype bf16 --warmup-steps 5 --num-steps 10 $flag"
  timeout --kill-after=15 150 "$PY" "$ROOT/examples/nsys/transformer_benchmark.py" $args \
    --json "$OUTDIR/ch07/checkpoint_$variant.json" >> "$OUTDIR/checkpoint_log.txt" 2>&1 \
    && "$PY" -c "import sys; from gpuprof.artifacts import record_file; record_file('ch07', sys.argv[1], sys.argv[2])" \
         "checkpoint_$variant.json" "python examples/nsys/transformer_benchmark.py $args --json checkpoint_$variant.json" \
    || { echo "[checkpoint] $variant failed: see checkpoint_log.txt"; status=1; }
done
tail -8 "$OUTDIR/checkpoint_log.txt" ;; esac
echo "[done] $(date -u +%H:%M:%S)"
exit $status
