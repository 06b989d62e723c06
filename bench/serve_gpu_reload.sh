#!/usr/bin/env bash
# Issue 17's server check on a GPU host: loading and unloading a GPU model 200 times while the
# server is under load leaks nothing and drops no request.
#
#   bench/serve_gpu_reload.sh [path/to/dlrec]
#
# Builds two small DLRM models with the CLI (datagen -> etl -> train on the CPU -> export), both
# with "instance_group": [{"kind": "KIND_GPU"}]: `m` is served under a steady `dlrec bench serve`
# load (gRPC) for the whole run, `c` is loaded and unloaded CYCLES times through the HTTP
# repository API (each load builds the CUDA model: streams, leased cuBLAS handles, tables, CUDA
# graphs; each unload destroys it), and one inference of `c` checks every load. WARM cycles run
# first (the caching pool and malloc's arenas reach their working size); the server's GPU memory
# (nvidia-smi, per process) and RSS are read after them and after the measured cycles, both
# while the load on m runs.
# Prints PASS/FAIL lines and the figures; exits non-zero when a check fails:
#   every load and unload answered 200, every inference of `c` answered, zero failed requests
#   of `m` (client and server metrics), GPU memory equal before/after, RSS within 5 % (+8 MiB).
# Environment: CYCLES (200), WARM (20), DURATION (60: seconds of load on m; the cycles must end
# within it), CONCURRENCY (16), BATCH (64), WORK (temporary dir).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DLREC="${1:-${DLREC:-$ROOT/build/bin/dlrec}}"
CYCLES="${CYCLES:-200}"
WARM="${WARM:-20}"
DURATION="${DURATION:-60}"
CONCURRENCY="${CONCURRENCY:-16}"
BATCH="${BATCH:-64}"
WORK="${WORK:-$(mktemp -d /tmp/dlrec-reload.XXXXXX)}"
[[ -x "$DLREC" ]] || { echo "FAIL: dlrec binary not found at $DLREC"; exit 2; }
command -v nvidia-smi >/dev/null || { echo "SKIP: no nvidia-smi (needs a GPU host)"; exit 77; }
mkdir -p "$WORK"
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  [[ "${KEEP_WORK:-0}" == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT

echo "== building the models in $WORK"
"$DLREC" --quiet datagen --out "$WORK/raw.tsv" --rows 20000 --seed 7 >/dev/null
"$DLREC" --quiet etl --input "$WORK/raw.tsv" --out "$WORK/data" >/dev/null
cat >"$WORK/cfg.json" <<'JSON'
{"model": {"arch": "dlrm", "embedding_dim": 16, "bottom_mlp": [64, 16], "top_mlp": [64, 1]},
 "optimizer": {"type": "adagrad", "lr": 0.02},
 "train": {"batch_size": 256, "max_steps": 30, "seed": 1, "device": "cpu"}}
JSON
"$DLREC" --quiet train --config "$WORK/cfg.json" --data "$WORK/data" --run "$WORK/run" >/dev/null
"$DLREC" --quiet export --run "$WORK/run" --out "$WORK/v1" >/dev/null
REPO="$WORK/repo"
for m in m c; do
  mkdir -p "$REPO/$m"
  cp -r "$WORK/v1" "$REPO/$m/1"
  echo '{"instance_group": [{"kind": "KIND_GPU", "count": 1}]}' >"$REPO/$m/config.json"
done

LOG="$WORK/server.log"
"$DLREC" serve --model-repository "$REPO" --host 127.0.0.1 --http-port 0 --grpc-port 0 \
  --metrics-port 0 --strict-startup >"$LOG" 2>&1 &
SERVER_PID=$!
READY=""
for _ in $(seq 1 240); do
  READY="$(grep -m1 'dlrec serve: ready' "$LOG" || true)"
  [[ -n "$READY" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.5
done
[[ -n "$READY" ]] || { echo "FAIL: server did not start:"; cat "$LOG"; exit 1; }
HTTP_PORT="$(sed -E 's/.*HTTP [^ ]*:([0-9]+),.*/\1/' <<<"$READY")"
GRPC_PORT="$(sed -E 's/.*gRPC [^ ]*:([0-9]+),.*/\1/' <<<"$READY")"
METRICS_PORT="$(sed -E 's/.*metrics [^ ]*:([0-9]+) .*/\1/' <<<"$READY")"
H="http://127.0.0.1:$HTTP_PORT"

gpu_mib() {  # this server's GPU memory in MiB
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
    awk -F', *' -v p="$SERVER_PID" '$1 == p { s += $2 } END { print s + 0 }'
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$SERVER_PID/status"; }
INFER_BODY="$WORK/infer.json"
python3 - "$INFER_BODY" <<'PY'
import json, sys
# Encoded inputs (docs/SERVING.md): dense [1, 13] and one id (0 is in every table) per feature.
inputs = [{"name": "dense", "shape": [1, 13], "datatype": "FP32", "data": [0.5] * 13}]
inputs += [{"name": f"cat_{t}", "shape": [1], "datatype": "INT64", "data": [0]} for t in range(26)]
json.dump({"inputs": inputs}, open(sys.argv[1], "w"))
PY
BAD=0
cycle() {  # one load + inference + unload of c; counts anything but 200 in BAD
  local a b i
  a=$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 --data '' -X POST "$H/v2/repository/models/c/load" || echo 000)
  i=$(curl -s -o "$WORK/infer.out" -w '%{http_code}' --max-time 30 -H 'Content-Type: application/json' \
      --data-binary "@$INFER_BODY" "$H/v2/models/c/infer" || echo 000)
  b=$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 --data '' -X POST "$H/v2/repository/models/c/unload" || echo 000)
  if [[ $a != 200 || $i != 200 || $b != 200 ]]; then
    BAD=$((BAD + 1)); echo "   cycle: load $a, infer $i ($(head -c 200 "$WORK/infer.out")), unload $b"
  fi
}

# The inference body must match the model's tensor contract: check it once on m.
CODE=$(curl -s -o "$WORK/infer.out" -w '%{http_code}' -H 'Content-Type: application/json' \
       --data-binary "@$INFER_BODY" "$H/v2/models/m/infer" || echo 000)
[[ $CODE == 200 ]] || { echo "FAIL: inference of m answered $CODE: $(head -c 300 "$WORK/infer.out")"; exit 1; }

# The load on m runs through the warm-up and the measured cycles, and the before/after readings
# are both taken under it: what the load itself holds (its connections, the batcher's larger
# buckets) is in both, so the difference is what the cycles left behind.
JSON="$WORK/bench.json"
"$DLREC" bench serve --protocol grpc --url "127.0.0.1:$GRPC_PORT" --model m --batch "$BATCH" \
  --concurrency "$CONCURRENCY" --duration "$DURATION" --warmup 1 --json "$JSON" \
  >"$WORK/bench.out" 2>&1 &
BENCH_PID=$!
sleep 3
echo "== $WARM warm-up cycles under a ${DURATION}s load on m"
for _ in $(seq 1 "$WARM"); do cycle; done
sleep 1
GPU0=$(gpu_mib); RSS0=$(rss_kib)
echo "== $CYCLES measured cycles"
T0=$(date +%s.%N)
for k in $(seq 1 "$CYCLES"); do
  cycle
  (( k % 50 == 0 )) && echo "   after $k: GPU $(gpu_mib) MiB, RSS $(( $(rss_kib) / 1024 )) MiB"
done
T1=$(date +%s.%N)
sleep 1
GPU1=$(gpu_mib); RSS1=$(rss_kib)
kill -0 "$BENCH_PID" 2>/dev/null && LOAD_ALIVE=1 || LOAD_ALIVE=0
set +e; wait "$BENCH_PID"; BENCH_RC=$?; set -e
curl -s --max-time 10 "http://127.0.0.1:$METRICS_PORT/metrics" >"$WORK/metrics.txt" || true
read -r OK FAIL RPS P50 P99 <<<"$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(j["total_success"], j["total_failures"], round(j["throughput_rps"], 1),
      j["latency_us"]["p50"], j["latency_us"]["p99"])' "$JSON" 2>/dev/null || echo "-1 -1 0 0 0")"
SRV_FAIL=$(awk '$1 ~ /^nv_inference_request_failure[{]/ && index($1, "model=\"m\"") { s += $2 } END { printf "%d", s }' "$WORK/metrics.txt")
kill -TERM "$SERVER_PID"; set +e; wait "$SERVER_PID"; SERVER_RC=$?; set -e; SERVER_PID=""

echo "figures: $CYCLES cycles in $(awk -v a="$T0" -v b="$T1" 'BEGIN { printf "%.1f", b - a }') s" \
     "($BAD bad); load on m: $OK ok, $FAIL failed (server $SRV_FAIL), $RPS req/s, p50 $P50 us," \
     "p99 $P99 us; GPU memory $GPU0 -> $GPU1 MiB; RSS $((RSS0 / 1024)) -> $((RSS1 / 1024)) MiB"
FAILED=0
check() { if [[ "$2" == 0 ]]; then echo "PASS: $1 ($3)"; else echo "FAIL: $1 ($3)"; FAILED=1; fi; }
check "every load, inference and unload of c answered 200" "$([[ $BAD == 0 ]]; echo $?)" "$BAD bad cycles"
check "the load on m ran through the cycles" "$([[ $LOAD_ALIVE == 1 && $BENCH_RC == 0 ]]; echo $?)" "rc $BENCH_RC"
check "zero failed requests of m" "$([[ $OK -gt 0 && $FAIL == 0 && $SRV_FAIL == 0 ]]; echo $?)" "client $FAIL, server $SRV_FAIL of $OK"
check "GPU memory flat" "$([[ $GPU1 -le $GPU0 ]]; echo $?)" "$GPU0 -> $GPU1 MiB"
check "RSS flat (5 % + 8 MiB)" "$([[ $RSS1 -le $((RSS0 + RSS0 / 20 + 8192)) ]]; echo $?)" "$RSS0 -> $RSS1 KiB"
check "graceful shutdown" "$([[ $SERVER_RC == 0 ]]; echo $?)" "rc $SERVER_RC"
if [[ $FAILED == 0 ]]; then echo "PASS: serve_gpu_reload"; else echo "FAIL: serve_gpu_reload"; fi
exit $FAILED
