#!/usr/bin/env bash
# The headline GPU figures of bench/RESULTS.md in one device call, with the PyTorch peers in the
# same call, and optionally an old build beside the new one (issue 17: "within 2 % (training)
# or 5 % (inference) of the old build, measured side by side in one device call").
#
#   bash bench/gpu_headline.sh --new DIR [--old DIR] [--out DIR] [options]
#
# DIR is a bundle made on the build machine by the project's recipe:
#   /work/shared/tools/bundle-portable.sh .gpu build-cuda/bin/dlrec build-cuda/bin/test_nn
#   git rev-parse --short HEAD > .gpu/COMMIT          # optional: named in the summary
# and carried to the GPU machine (run's carry: [".gpu", ".gpu-old"]). DIR/bin/dlrec must exist
# (DIR/bin/dlrec.gz or .xz is unpacked first); DIR/env.sh, if there, supplies LD_LIBRARY_PATH.
#
# What runs, per round (old and new alternate; the first of the two swaps every round):
#   train  dlrec bench train, MLPerf DLRM bf16 and fp16 at batch 32768,55296 and DCNv2 bf16 at
#          55296, 30 steps after 5 warm-up; DCNv2 fp16 and DeepFM fp16 (Adagrad, 16384) only if
#          the build accepts fp16 for graph models (probed first; builds before the fold refuse it)
#   infer  dlrec bench infer --precision bf16 at batch 1,2048,32768, 500 calls after 50; DCNv2
#          and DeepFM (Adagrad) at the same batches, 300 calls after 30
#   zoo    (not in the default --parts) DeepFM and Wide&Deep bf16, Adagrad, batch 16384, 50
#          steps after 5; Wide&Deep is configs/wide_deep.json minus the wide layer's FTRL, as
#          measured for bench/RESULTS.md (layer optimizers are refused on CUDA)
#   e2e    (not in the default --parts: ~75 s per build and round, plus ~1 min of set-up; best
#          in a call of its own, e.g. --parts e2e --rounds 2) gRPC end to end as in
#          bench/RESULTS.md: bench/serve_gpu_e2e.sh e2e with the server and the load generator
#          polling (SPIN_US=2000 CLIENT_SPIN_US=2000), DURATION=5; the model is made once, by
#          the new build, and served by each build in turn
#   and, in the first --peer-rounds rounds, right after each dlrec pair: bench/pytorch_dlrm_gpu.py
#   --bf16, bench/pytorch_dcnv2_gpu.py --bf16, bench/pytorch_dlrm_infer_gpu.py (same settings).
# Before round 1: one untimed warm-up run (fresh hosts run their first seconds slow) and the
# fp16 probes. After the rounds: bench/gpu_checks.sh (the torch.optim comparison), unless
# --no-checks. Every command has a time limit; a failure is listed in the summary, not fatal.
#
# Output under --out (default $OUT, else ./out): summary.md (medians per build, new vs old,
# new vs PyTorch), results.tsv, env.txt, notes.txt and logs.tgz (logs/: one log per command,
# commands.txt with each command's time and exit status; packed because the device tool brings
# back at most 8 files). Keep the logs out of the repository (bench/logs/ is ignored).
#
# Device time: about 5.5 min with --old and the defaults (3 rounds, peers in 2), about 3 min
# without (estimates from earlier calls' start-up times, not yet measured as a whole);
# --dry-run prints the plan and its estimate without running anything (no GPU needed).
# --budget-s S (default 450) starts no new round once the longest round so far would end past
# S seconds after the start: the summary then says how many rounds ran. Give the device call
# timeout_s 600 (its limit); the checks after the rounds take well under a minute.
set -u

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; cat <<'EOF'
Options:
  --new DIR          bundle under test (required)
  --old DIR          reference bundle, run alternately with --new in every round
  --out DIR          output folder (default $OUT, else ./out)
  --rounds N         rounds (default 3 with --old, else 2)
  --peer-rounds N    rounds that also run the PyTorch peers (default 2; 0: no peers)
  --parts LIST       comma-separated: train,infer,zoo,e2e (default train,infer)
  --budget-s S       no new round once the longest round would end past S s (default 450)
  --no-checks        skip bench/gpu_checks.sh
  --pytest-dir DIR   passed to bench/gpu_checks.sh (a carried pytest: see its --help)
  --python CMD       Python with torch for the peers (default python3)
  --dry-run          print the plan and its time estimate; run nothing
  -h, --help         this text
EOF
}

die() { echo "gpu_headline.sh: $*" >&2; exit 2; }

NEW="" OLD="" OUTDIR=${OUT:-out} ROUNDS="" PEER_ROUNDS=2 PARTS="train,infer" BUDGET=450
CHECKS=1 PYTEST_DIR="" PY=python3 DRY=0
while [ $# -gt 0 ]; do
  case $1 in
    --new) NEW=${2:?--new needs a folder}; shift 2 ;;
    --old) OLD=${2:?--old needs a folder}; shift 2 ;;
    --out) OUTDIR=${2:?--out needs a folder}; shift 2 ;;
    --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
    --peer-rounds) PEER_ROUNDS=${2:?--peer-rounds needs a number}; shift 2 ;;
    --parts) PARTS=${2:?--parts needs a list}; shift 2 ;;
    --budget-s) BUDGET=${2:?--budget-s needs seconds}; shift 2 ;;
    --no-checks) CHECKS=0; shift ;;
    --pytest-dir) PYTEST_DIR=${2:?--pytest-dir needs a folder}; shift 2 ;;
    --python) PY=${2:?--python needs a command}; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$NEW" ] || die "--new DIR is required (see --help)"
[ -n "$ROUNDS" ] || { [ -n "$OLD" ] && ROUNDS=3 || ROUNDS=2; }
for v in rounds:ROUNDS peer-rounds:PEER_ROUNDS budget-s:BUDGET; do
  n=${v#*:}; [[ ${!n} =~ ^[0-9]+$ ]] || die "--${v%%:*} must be a whole number, got '${!n}'"
done
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] || die "--rounds must be 1..20, got $ROUNDS"
DO_TRAIN=0 DO_ZOO=0 DO_INFER=0 DO_E2E=0
IFS=, read -r -a parts <<< "$PARTS"
[ ${#parts[@]} -gt 0 ] || die "--parts is empty"
for p in "${parts[@]}"; do
  case $p in train) DO_TRAIN=1 ;; zoo) DO_ZOO=1 ;; infer) DO_INFER=1 ;; e2e) DO_E2E=1 ;;
    *) die "--parts: unknown part '$p' (train, infer, zoo, e2e)" ;; esac
done
[ "$OLD" != "$NEW" ] || die "--old and --new name the same folder"
# Paths as given (relative to where the script was started), then work from the repository
# root: the commands name configs/ and bench/ relative to it.
NEW=$(realpath -m "$NEW"); [ -z "$OLD" ] || OLD=$(realpath -m "$OLD")
OUTDIR=$(realpath -m "$OUTDIR"); [ -z "$PYTEST_DIR" ] || PYTEST_DIR=$(realpath -m "$PYTEST_DIR")
[[ $PY == */* ]] && PY=$(realpath -m "$PY")
cd "$(dirname "$0")/.." || die "cannot enter the repository root"

BUILDS=(new); [ -n "$OLD" ] && BUILDS=(old new)
declare -A DIR=([new]=$NEW [old]=$OLD) LDP=() DLREC=()

# A bundle's dlrec (unpacked if carried compressed) and its library path.
prepare_bundle() {  # name
  local b=$1 d=${DIR[$1]} f
  [ -d "$d" ] || die "--$b: no folder '$d'"
  DLREC[$b]=$d/bin/dlrec
  if [ $DRY = 1 ]; then
    [ -e "$d/bin/dlrec" ] || [ -e "$d/bin/dlrec.gz" ] || [ -e "$d/bin/dlrec.xz" ] \
      || die "--$b: no $d/bin/dlrec (nor .gz/.xz)"
    LDP[$b]=""; return 0
  fi
  for f in "$d"/bin/*.gz "$d"/lib/*.gz; do
    [ -e "$f" ] && [ ! -e "${f%.gz}" ] && gunzip -k "$f"
  done
  for f in "$d"/bin/*.xz "$d"/lib/*.xz; do
    [ -e "$f" ] && [ ! -e "${f%.xz}" ] && xz -dk "$f"
  done
  [ -x "${DLREC[$b]}" ] || die "--$b: ${DLREC[$b]} is missing or not executable"
  LDP[$b]=${LD_LIBRARY_PATH:-}
  if [ -f "$d/env.sh" ]; then
    LDP[$b]=$(bash -c 'source "$1/env.sh" >/dev/null 2>&1; printf %s "$LD_LIBRARY_PATH"' _ "$d")
  fi
}
for b in "${BUILDS[@]}"; do prepare_bundle "$b"; done

L=$OUTDIR/logs
RES=$OUTDIR/results.tsv NOTES=$OUTDIR/notes.txt ENVF=$OUTDIR/env.txt
if [ $DRY = 0 ]; then
  mkdir -p "$L" || die "cannot create $L"
  : > "$RES"; : > "$NOTES"
fi
export NCCL_NVLS_ENABLE=0  # bundle-portable's env.sh says so for hosts with several GPUs
START=$(date +%s)
ESTIMATE=0  # seconds, summed over the plan in a dry run

note() { echo "$*"; [ $DRY = 1 ] || echo "- $*" >> "$NOTES"; }

# run LIMIT LOGNAME EST_S CMD... : one command with a time limit, its output in logs/LOGNAME.log.
run() {
  local limit=$1 log=$2 est=$3; shift 3
  if [ $DRY = 1 ]; then
    ESTIMATE=$((ESTIMATE + est)); printf '  [~%3ss] %s\n' "$est" "$*"; return 0
  fi
  local t0 rc why=""
  t0=$(date +%s%N)
  timeout "$limit" "$@" > "$L/$log.log" 2>&1; rc=$?
  printf '%s\t%d ms\trc=%d\t%s\n' "$log" $((($(date +%s%N) - t0) / 1000000)) "$rc" "$*" \
    >> "$L/commands.txt"
  if [ $rc -ne 0 ] && [ -z "${QUIET:-}" ]; then  # QUIET=1: the caller reports it
    [ $rc = 124 ] && why=": over its ${limit} s limit"
    note "$log failed (rc $rc$why): $*; last lines:" \
      "$(tail -3 "$L/$log.log" | tr '\n' ' ' | cut -c1-300)"
  fi
  return $rc
}

dl() {  # build LIMIT LOGNAME EST_S dlrec-args...
  local b=$1; shift
  if [ $DRY = 1 ]; then run "$1" "$2" "$3" "${DLREC[$b]}" "${@:4}"; return; fi
  run "$1" "$2" "$3" env LD_LIBRARY_PATH="${LDP[$b]}" "${DLREC[$b]}" "${@:4}"
}

# Figures from a log into results.tsv: "bench train:" / "pytorch gpu train:" lines give ms per
# step per batch, "bench infer:" / "pytorch infer:" lines p50 and p99 per batch.
record() {  # round build figure-prefix logname
  [ $DRY = 1 ] && return 0
  awk -v r="$1" -v b="$2" -v f="$3" '
    function field(k,   i) {  # the value of "k=value" on this line, or ""
      for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) return substr($i, length(k) + 2)
      return ""
    }
    function out(metric, v) {
      if (v != "") print r "\t" b "\t" f "_" field("batch") "\t" metric "\t" v
    }
    /^(bench train:|pytorch gpu train:)/ && field("batch") != "" {
      out("ms", field("ms/iter")); out("samples_s", field("samples/s"))
    }
    /^(bench infer:|pytorch infer: .*with-copies)/ && field("batch") != "" {
      out("p50", field("p50_us")); out("p99", field("p99_us"))
    }
    / summary: grpc / {  # bench/serve_gpu_e2e.sh e2e: one line per load
      key = f "_" ($0 ~ / rpc=live / ? "live" : field("batch") "x" field("concurrency"))
      sps = ""
      for (i = 2; i <= NF; i++) if ($i == "samples/s)") sps = substr($(i - 1), 2)
      print r "\t" b "\t" key "\tp50\t" field("p50")
      print r "\t" b "\t" key "\tp99\t" field("p99")
      if (sps != "") print r "\t" b "\t" key "\tsamples_s\t" sps
      print r "\t" b "\t" key "\tfailures\t" field("failures")
    }
  ' "$L/$4.log" >> "$RES"
}

E2E_WORK=/tmp/dlrec_headline_e2e  # data and model of the e2e part (~17 GB), removed at the end

# Wide&Deep as measured: configs/wide_deep.json without the wide layer's own optimizer (FTRL;
# per-layer optimizers are refused on CUDA).
WD_CONFIG=$L/wide_deep_cuda.json
make_wd_config() {
  if [ $DRY = 1 ]; then
    echo "  (writes $WD_CONFIG: configs/wide_deep.json without layer optimizers)"; return 0
  fi
  "$PY" - configs/wide_deep.json "$WD_CONFIG" <<'PY' || return 1
import json, sys
c = json.load(open(sys.argv[1]))
for layer in c["model"]["layers"]:
    layer.pop("optimizer", None)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
}

# DeepFM as served in bench/RESULTS.md: configs/deepfm.json with Adagrad (Adam is refused on
# CUDA), for the infer part.
DFM_CONFIG=$L/deepfm_adagrad.json
make_dfm_config() {
  [ $DRY = 1 ] && return 0
  "$PY" - configs/deepfm.json "$DFM_CONFIG" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["optimizer"] = {"type": "adagrad", "lr": 0.001}
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
}

TRAIN=(bench train --device cuda --steps 30 --warmup 5)
ZOO=(bench train --device cuda --optimizer adagrad --batch 16384 --steps 50 --warmup 5)
declare -A FP16=()  # build:model -> 1 when the build trains that graph model in fp16

probe_fp16() {  # build model config [more bench-train args]
  local b=$1 m=$2 c=$3; shift 3
  if QUIET=1 dl "$b" 60 "probe_fp16_${m}_$b" 5 bench train --config "$c" --device cuda \
      --batch 1024 --steps 1 --warmup 0 --max-rows 1000 --precision fp16 "$@"; then
    [ $DRY = 1 ] && { echo "         (if accepted: $m fp16 runs in every round)"; return 0; }
    FP16[$b:$m]=1
  else
    note "fp16 not run for $m with the $b build (probe refused or failed):" \
      "$(grep -m1 -i 'error\|support' "$L/probe_fp16_${m}_$b.log" | cut -c1-200)"
  fi
}

# One dlrec figure for every build in this round's order, then its peer.
pair() {  # round prefix limit est dlrec-args...
  local r=$1 f=$2 lim=$3 est=$4 b; shift 4
  for b in "${ORDER[@]}"; do
    dl "$b" "$lim" "r${r}_${f}_$b" "$est" "$@" && record "$r" "$b" "$f" "r${r}_${f}_$b"
  done
}
peer() {  # round prefix limit est python-args...
  local r=$1 f=$2 lim=$3 est=$4; shift 4
  [ "$r" -le "$PEER_ROUNDS" ] || return 0
  run "$lim" "r${r}_${f}_pytorch" "$est" "$PY" "$@" && record "$r" pytorch "$f" "r${r}_${f}_pytorch"
}

round() {  # r
  local r=$1
  ORDER=("${BUILDS[@]}")
  [ ${#BUILDS[@]} = 2 ] && [ $((r % 2)) = 0 ] && ORDER=(new old)
  local with_peers=""
  [ "$r" -le "$PEER_ROUNDS" ] && [ $((DO_TRAIN + DO_INFER)) -gt 0 ] && with_peers=", PyTorch peers"
  echo "round $r of $ROUNDS: ${ORDER[*]}$with_peers"
  if [ $DO_TRAIN = 1 ]; then
    local dlrm=(--config configs/mlperf_dlrm.json --batch "32768,55296")
    pair "$r" dlrm_bf16 120 8 "${TRAIN[@]}" "${dlrm[@]}" --precision bf16
    pair "$r" dlrm_fp16 120 8 "${TRAIN[@]}" "${dlrm[@]}" --precision fp16
    peer "$r" dlrm_bf16 240 12 bench/pytorch_dlrm_gpu.py --batch 32768,55296 --steps 30 \
      --warmup 5 --bf16 --build-on cuda
    pair "$r" dcnv2_bf16 120 8 "${TRAIN[@]}" --config configs/dcnv2.json --batch 55296 \
      --precision bf16
    peer "$r" dcnv2_bf16 240 12 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 30 --warmup 5 \
      --bf16
    for b in "${ORDER[@]}"; do
      [ -n "${FP16[$b:dcnv2]:-}" ] || continue
      dl "$b" 120 "r${r}_dcnv2_fp16_$b" 8 "${TRAIN[@]}" --config configs/dcnv2.json --batch 55296 \
        --precision fp16 && record "$r" "$b" dcnv2_fp16 "r${r}_dcnv2_fp16_$b"
    done
    for b in "${ORDER[@]}"; do  # with its bf16 run beside it when fp16 is accepted
      [ -n "${FP16[$b:deepfm]:-}" ] || continue
      for p in bf16 fp16; do
        dl "$b" 90 "r${r}_deepfm_${p}_$b" 6 "${ZOO[@]}" --config configs/deepfm.json \
          --precision $p && record "$r" "$b" deepfm_$p "r${r}_deepfm_${p}_$b"
      done
    done
  fi
  if [ $DO_ZOO = 1 ]; then
    for b in "${ORDER[@]}"; do  # (already run by the train part where fp16 is accepted)
      [ -z "${FP16[$b:deepfm]:-}" ] || [ $DO_TRAIN = 0 ] || continue
      dl "$b" 90 "r${r}_deepfm_bf16_$b" 6 "${ZOO[@]}" --config configs/deepfm.json \
        --precision bf16 && record "$r" "$b" deepfm_bf16 "r${r}_deepfm_bf16_$b"
    done
    pair "$r" widedeep_bf16 90 6 "${ZOO[@]}" --config "$WD_CONFIG" --precision bf16
  fi
  if [ $DO_E2E = 1 ]; then
    local e=("${ORDER[@]}")  # the first run makes the data and the model: the new build's
    [ -f "$E2E_WORK/repo/dlrm/config.json" ] || e=(new ${OLD:+old})
    for b in "${e[@]}"; do
      run 400 "r${r}_e2e_$b" 75 env LD_LIBRARY_PATH="${LDP[$b]}" BIN="${DIR[$b]}/bin" \
        OUT="$L/r${r}_e2e_$b" WORK="$E2E_WORK" REUSE=1 DURATION=5 SPIN_US=2000 \
        CLIENT_SPIN_US=2000 bash bench/serve_gpu_e2e.sh e2e && record "$r" "$b" e2e "r${r}_e2e_$b"
    done
  fi
  if [ $DO_INFER = 1 ]; then
    pair "$r" infer 120 8 bench infer --device cuda --precision bf16 --batch 1,2048,32768 \
      --iters 500 --warmup 50
    # The graph models' serving (batch 1: the fused small-batch forward's program form where
    # its measured row limit takes it, bench/RESULTS.md).
    pair "$r" infer_dcnv2 120 8 bench infer --device cuda --precision bf16 --batch 1,2048,32768 \
      --iters 300 --warmup 30 --config configs/dcnv2.json
    [ -f "$DFM_CONFIG" ] || [ $DRY = 1 ] && pair "$r" infer_deepfm 120 6 bench infer --device cuda \
      --precision bf16 --batch 1,2048,32768 --iters 300 --warmup 30 --config "$DFM_CONFIG"
    peer "$r" infer 240 15 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 \
      --warmup 50 --build-on cuda
  fi
}

# --- the call -------------------------------------------------------------------------------
[ $DRY = 1 ] && echo "dry run: the plan (estimated seconds per command), nothing is executed"
if [ $DRY = 0 ]; then
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
      2>&1 | head -2 | tr '\n' ' ')"
    echo "host: $(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')," \
      "kernel $(uname -r)"
    echo "python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch",
      torch.__version__)' 2>&1 | tail -1)"
    for b in "${BUILDS[@]}"; do
      commit=$(cat "${DIR[$b]}/COMMIT" 2>/dev/null || echo 'not recorded (no COMMIT file)')
      echo "$b: ${DIR[$b]}, commit $commit, dlrec sha256 $(sha256sum "${DLREC[$b]}" | cut -c1-16)"
    done
    echo "rounds: $ROUNDS (peers in $PEER_ROUNDS), parts: $PARTS"
  } > "$ENVF"
  cat "$ENVF"
fi

echo "warm-up (untimed) and probes:"
dl new 120 warmup 10 "${TRAIN[@]}" --config configs/mlperf_dlrm.json --batch 32768 --precision bf16
for b in "${BUILDS[@]}"; do
  if [ $DO_TRAIN = 1 ]; then
    probe_fp16 "$b" dcnv2 configs/dcnv2.json
    probe_fp16 "$b" deepfm configs/deepfm.json --optimizer adagrad  # as ZOO runs it (no Adam on CUDA)
  fi
done
if [ $DO_INFER = 1 ] && ! make_dfm_config; then
  note "DeepFM serving skipped: could not write $DFM_CONFIG"
fi
if [ $DO_ZOO = 1 ] && ! make_wd_config; then
  note "Wide&Deep skipped: could not write $WD_CONFIG"
fi

RAN=0 LONGEST=0
for r in $(seq 1 "$ROUNDS"); do
  now=$(($(date +%s) - START))
  if [ $DRY = 0 ] && [ "$r" -gt 1 ] && [ $((now + LONGEST)) -gt "$BUDGET" ]; then
    note "stopped after $RAN of $ROUNDS rounds: ${now} s used, the longest round took" \
      "${LONGEST} s, budget ${BUDGET} s"
    break
  fi
  t0=$(date +%s)
  round "$r"
  RAN=$r
  d=$(($(date +%s) - t0)); [ $d -gt $LONGEST ] && LONGEST=$d
done

if [ $CHECKS = 1 ]; then
  echo "checks:"
  args=(--bundle "$NEW" --python "$PY"); [ -n "$PYTEST_DIR" ] && args+=(--pytest-dir "$PYTEST_DIR")
  QUIET=1 run 300 checks 30 bash bench/gpu_checks.sh "${args[@]}"
  if [ $DRY = 0 ]; then
    grep -E "^gpu_checks:" "$L/checks.log" | sed 's/^/- /' >> "$NOTES"
    grep -q "^gpu_checks:" "$L/checks.log" || note "checks: no verdict line (see logs/checks.log)"
  fi
fi

if [ $DRY = 1 ]; then
  echo "estimated device time: ~$((ESTIMATE / 60)) min $((ESTIMATE % 60)) s" \
    "(plus the machine's start)"
  [ $ESTIMATE -le "$BUDGET" ] || echo "over --budget-s $BUDGET: later rounds would be skipped"
  exit 0
fi
[ $DO_E2E = 1 ] && rm -rf "$E2E_WORK"
if awk -F'\t' '$4 == "failures" && $5 != 0 {bad = 1} END {exit !bad}' "$RES"; then
  note "gRPC e2e: some loads had failed requests (results.tsv, metric failures)"
fi
echo "- total: $(($(date +%s) - START)) s, $RAN round(s)" >> "$NOTES"
"$PY" bench/headline_summary.py "$RES" --env "$ENVF" --notes "$NOTES" > "$OUTDIR/summary.md" \
  || python3 bench/headline_summary.py "$RES" --env "$ENVF" --notes "$NOTES" > "$OUTDIR/summary.md"
cat "$OUTDIR/summary.md"
# The device tool brings back at most 8 files from $OUT: the logs travel as one archive.
tar czf "$OUTDIR/logs.tgz" -C "$OUTDIR" logs && rm -rf "$L"
echo "logs: $OUTDIR/logs.tgz (logs/commands.txt: each command, its time and exit status)"
