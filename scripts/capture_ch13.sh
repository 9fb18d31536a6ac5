#!/usr/bin/env bash
# Chapter 13's captures on N GPUs of one machine, in one call, everything small packed into one tarball.
#
#   bash scripts/capture_ch13.sh 4                      # on a 4-GPU machine: the model's check (about 7 min)
#   CH13_STEPS=env,bf16 bash scripts/capture_ch13.sh 2  # on 2 GPUs: only the BF16 rerun the chapter owes
#   CH13_CPU=1 bash scripts/capture_ch13.sh 4 /tmp/c13  # on a CPU (gloo, tiny model, no nsys): checks the commands
#
# Arguments: N (ranks, default 4) and the output folder (default $OUT, else ./ch13_out). It writes
# <out>/ch13_<N>gpu.tar.gz (split into ch13_<N>gpu.tar.gz.part_aa, _ab, ... where it passes 15 MB; the JSON
# records, the trimmed SQLite exports (--lean above two ranks), the recipes' CSVs, the logs,
# the machine's topology and NCCL's version and tuning lines: everything the chapter reads, a few MB) and,
# when they exist, <out>/ch13_<N>gpu_raw_<stem>.tar.gz (the untrimmed exports of one run, one tarball
# per run so that each stays under the 16 MiB a device call returns per file; if one does not, nothing
# the chapter needs is lost).
#
# Steps, in order of need (CH13_STEPS, comma-separated, picks some; default: all):
#   env       nvidia-smi -L and topo -m, torch's NCCL version, nsys --version
#   modes     ddp, fsdp_reshard, fsdp_keep on N ranks, no profiler           -> modes.json
#   nsys      the same under nsys, one report per rank                      -> modes_nsys.json, modes_rank*.sqlite.gz
#   recipes   nsys recipe nccl_sum and nccl_gpu_overlap_trace on those reports (CSV kept, the reports dropped)
#   pfoff     fsdp_reshard --prefetch off under nsys, with NCCL's tuning log -> pf_off.json, pf_off_rank*.sqlite.gz
#   compute   one process, no communication: the model's per-unit compute  -> compute_1gpu.json
#   toobig    --size ddp-too-big: DDP must be refused, FSDP2 must run        -> too_big_ddp.txt, too_big_fsdp.json
#   bf16      ddp,fsdp_reshard --mp bf16 --warmup 5 --steps 20               -> bf16.json
#   unit      fsdp_reshard --unit block:4 under nsys, with NCCL's tuning log -> unit4.json, unit4_rank*.sqlite.gz
#   pack      trim the exports (scripts/trim_ch13.py), run scripts/check_ch13.py on the results against the
#             committed two-GPU fit (check.txt, printed at the end), the tarballs (always runs last)
# Each step has a time limit and the whole run a budget (CH13_BUDGET seconds, default 420): a step that
# cannot finish inside what is left is skipped and logged, so the tarball always comes back. steps.tsv
# says what ran, how long, and its exit status. Every flag here is one of fsdp_training.py --help's.
set -u
case "${1:-}" in -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
N=${1:-4}
case "$N" in ''|*[!0-9]*) echo "error: N must be a number of ranks, not '$N' (see --help)" >&2; exit 2 ;; esac
OUTDIR=${2:-${OUT:-./ch13_out}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S="$ROOT/examples/nsys/fsdp_training.py"
TAG="ch13_${N}gpu"
W="$OUTDIR/$TAG"
mkdir -p "$W"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BUDGET=${CH13_BUDGET:-420}
STEPS=${CH13_STEPS:-env,modes,nsys,recipes,pfoff,compute,toobig,bf16,unit}
T0=$(date +%s)

if [ -n "${CH13_CPU:-}" ]; then
  SIZE="--cpu"                                    # tiny preset on a CPU, gloo
  WARM="--warmup 1 --steps 2"                     # fewer steps: the commands are checked, not timed
  BIG="--cpu --d-model 4096 --heads 32 --d-ff 16384 --vocab 32000 --layers 400"  # refused for host memory
  FIT="--cpu"
  NSYS_BIN=${NSYS:-}                              # none on a CPU unless NSYS names one (a test stand-in)
else
  SIZE=""
  WARM=""
  BIG="--size ddp-too-big"
  FIT="--size ddp-too-big"
  NSYS_BIN=${NSYS:-$(command -v nsys || true)}
  if [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then     # the first N GPUs, so N=2 on a 4-GPU machine takes two
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((N - 1))); export CUDA_VISIBLE_DEVICES
  fi
fi
TR="$PY -m torch.distributed.run --standalone --nproc-per-node $N"
NSARGS="profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --export=sqlite --force-overwrite=true"
printf 'step\tseconds\trc\tcommand\n' > "$W/steps.tsv"

wanted() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# run NAME LIMIT CMD...: the command with its output in NAME.log, inside LIMIT seconds and the budget
run() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - ($(date +%s) - T0)))
  if [ "$left" -lt 20 ]; then
    printf '%s\t0\tskipped: %ss of the budget left\t%s\n' "$name" "$left" "$*" >> "$W/steps.tsv"
    echo "[$name] skipped: ${left}s of the ${BUDGET}s budget left"; return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t=$(date +%s)
  echo "[$name] $*"
  timeout --signal=TERM --kill-after=15 "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$(($(date +%s) - t))" "$rc" "$*" >> "$W/steps.tsv"
  tail -n 3 "$W/$name.log" | sed "s/^/[$name] /"
  return 0
}

# traced NAME REPORT LIMIT ARGS...: fsdp_training.py under torchrun, inside nsys per rank when nsys is here,
# the reports (and their SQLite exports) named REPORT_rank<R>
traced() {
  local name=$1 report=$2 limit=$3; shift 3
  if [ -n "$NSYS_BIN" ]; then
    run "$name" "$limit" $TR --no-python "$NSYS_BIN" $NSARGS -o "$W/${report}_rank%q{RANK}" $PY "$S" "$@"
  else
    echo "[$name] no nsys here: the same command without it"
    run "$name" "$limit" $TR "$S" "$@"
  fi
}

if wanted env; then
  {
    echo "# $(date -u +%FT%TZ) N=$N CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-} commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
    nvidia-smi -L 2>&1 || echo "no nvidia-smi"
    $PY -c "import torch; print('torch', torch.__version__, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '(no CUDA)')" 2>&1
    [ -n "$NSYS_BIN" ] && "$NSYS_BIN" --version 2>&1
  } > "$W/env.txt"
  nvidia-smi topo -m > "$W/topo.txt" 2>&1 || echo "no nvidia-smi" > "$W/topo.txt"
  cat "$W/env.txt"
fi
wanted modes && run modes 120 $TR "$S" $SIZE $WARM --json "$W/modes.json"
wanted nsys && traced modes_nsys modes 180 $SIZE $WARM --json "$W/modes_nsys.json"
if wanted recipes && [ -n "$NSYS_BIN" ] && ls "$W"/modes_rank*.nsys-rep > /dev/null 2>&1; then
  for r in nccl_sum nccl_gpu_overlap_trace; do
    run "recipe_$r" 120 "$NSYS_BIN" recipe "$r" --input "$W"/modes_rank*.nsys-rep --output "$W/recipe_$r" --mode none
    $PY - "$W/recipe_$r" >> "$W/recipe_$r.log" 2>&1 <<'PYEOF'
import shutil, sys
from pathlib import Path
import pandas as pd
top = Path(sys.argv[1])
for f in sorted(top.rglob("*.parquet")):  # each table as recipe_<name>_<path>.csv beside the folder
    out = top.parent / (top.name + "_" + "_".join(f.relative_to(top).with_suffix("").parts) + ".csv")
    try:
        t = pd.read_parquet(f)
    except ImportError as e:  # no Parquet reader here: keep the table as it is
        shutil.copy(f, out.with_suffix(".parquet"))
        print(out.with_suffix(".parquet").name, "kept as Parquet:", str(e).splitlines()[0])
        continue
    t.to_csv(out, index=not isinstance(t.index, pd.RangeIndex))
    print(out.name, len(t), "rows")
PYEOF
  done
fi
if wanted pfoff; then
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$W/nccl_pf_off.%h.%p.log" \
    traced pf_off pf_off 150 $SIZE $WARM --mode fsdp_reshard --prefetch off --json "$W/pf_off.json"
fi
wanted compute && run compute_1gpu 90 $PY "$S" $SIZE $WARM --mode ddp --json "$W/compute_1gpu.json"
if wanted toobig; then
  run too_big_ddp 90 $TR "$S" $BIG --mode ddp --warmup 1 --steps 2
  # --lr 1e-4: at the default 1e-3 the 5.5 B model's loss rose at its third step on 4 x H100 (2026-11-27)
  run too_big_fsdp 200 $TR "$S" $FIT --mode fsdp_reshard --warmup 1 --steps 3 --lr 0.0001 --json "$W/too_big_fsdp.json"
fi
wanted bf16 && run bf16 150 $TR "$S" $SIZE --mode ddp,fsdp_reshard --mp bf16 --warmup 5 --steps 20 --json "$W/bf16.json"
if wanted unit; then
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$W/nccl_unit4.%h.%p.log" \
    traced unit4 unit4 150 $SIZE $WARM --mode fsdp_reshard --unit block:4 --json "$W/unit4.json"
fi

# pack: trim the exports, keep NCCL's tuning lines only, drop the reports, two tarballs
shopt -s nullglob
raw=("$W"/*.sqlite)
if [ ${#raw[@]} -gt 0 ]; then
  lean=(); [ "$N" -gt 2 ] && lean=(--lean)   # four ranks' exports: keep what the four-GPU check reads (3x smaller)
  $PY "$ROOT/scripts/trim_ch13.py" "${raw[@]}" --out "$W" --notes "$W/trim_notes.json" "${lean[@]}" > "$W/trim.log" 2>&1 \
    || echo "trim failed: see trim.log" | tee -a "$W/trim.log"
  mkdir -p "$OUTDIR/${TAG}_raw" && mv "${raw[@]}" "$OUTDIR/${TAG}_raw/"
fi
# the issue's checks on what came out, against the committed two-GPU fit (scripts/check_ch13.py), for the log
if [ -f "$W/modes.json" ]; then
  compute=(); [ -f "$W/compute_1gpu.json" ] && compute=(--compute "$W/compute_1gpu.json")
  $PY "$ROOT/scripts/check_ch13.py" --fit "$ROOT/artifacts/ch13" --run "$W" "${compute[@]}" > "$W/check.txt" 2>&1
  echo "check_ch13.py: exit $?" >> "$W/check.txt"
fi
for f in "$W"/nccl_*.log; do    # the version, the topology and one line per tuned collective size
  grep -E "NCCL version|Channel|Trees|Ring|Algo|algorithm|proto|NVLS|P2P" "$f" | sort -u > "$f.txt"; rm -f "$f"
done
rm -f "$W"/*.nsys-rep
rm -rf "$W"/recipe_nccl_sum "$W"/recipe_nccl_gpu_overlap_trace "$W"/*_pqtdir   # the recipes' Parquet folders
# the overlap trace lists every kernel of every rank (147,564 rows, 11 MB on four GPUs): keep the NCCL kernels' rows
trace="$W/recipe_nccl_gpu_overlap_trace_rank_trace.csv"
if [ -f "$trace" ]; then
  { head -n 1 "$trace"; grep '^nccl' "$trace"; } | gzip -n > "$W/recipe_nccl_gpu_overlap_trace_nccl.csv.gz" && rm -f "$trace"
fi
printf 'pack\t%s\t0\ttar\n' "$(($(date +%s) - T0))" >> "$W/steps.tsv"
tar czf "$OUTDIR/$TAG.tar.gz" -C "$OUTDIR" "$TAG"
if [ "$(stat -c %s "$OUTDIR/$TAG.tar.gz")" -gt 15000000 ]; then   # a device call returns files of 16 MiB at most
  split -b 15000000 "$OUTDIR/$TAG.tar.gz" "$OUTDIR/$TAG.tar.gz.part_"   # rejoin: cat $TAG.tar.gz.part_* > $TAG.tar.gz
fi
if [ -d "$OUTDIR/${TAG}_raw" ]; then  # one tarball per report stem: each must stay under what a call returns (16 MiB)
  for stem in $(ls "$OUTDIR/${TAG}_raw" | sed 's/_rank[0-9]*\.sqlite$//' | sort -u); do
    tar czf "$OUTDIR/${TAG}_raw_$stem.tar.gz" -C "$OUTDIR" $(cd "$OUTDIR" && ls -d "${TAG}_raw/${stem}"_rank*.sqlite)
  done
  rm -rf "$OUTDIR/${TAG}_raw"
fi
rm -rf "$W"
echo "wrote $(ls -la "$OUTDIR"/${TAG}*.tar.gz | awk '{print $5, $9}' | tr '\n' ' ')in $(($(date +%s) - T0)) s"
tar xzf "$OUTDIR/$TAG.tar.gz" -O "$TAG/steps.tsv" | cut -f1-3 | awk -F '\t' '{printf "%-32s %8s %s\n", $1, $2, $3}'
[ -f "$OUTDIR/$TAG.tar.gz.part_aa" ] && rm -f "$OUTDIR/$TAG.tar.gz"   # the parts come back instead
tar xzf "$OUTDIR/$TAG.tar.gz" -O "$TAG/check.txt" 2>/dev/null | tail -n 40
