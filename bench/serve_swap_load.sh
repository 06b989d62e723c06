#!/usr/bin/env bash
# Acceptance scenario of the inference server (issue 5): a 60-second load at 64 concurrent
# clients with a model version swap in the middle drops no request, and the server's metrics
# count exactly the successes the client saw.
#
#   bench/serve_swap_load.sh [path/to/dlrec]
#
# Builds a small model repository with the CLI (datagen -> etl -> train -> export as m/1; a
# second training run is exported aside as the future m/2), then for each protocol:
# starts `dlrec serve` on free loopback ports (port 0, read back from its ready line), runs
# `dlrec bench serve`, and at SWAP_AT seconds into the measured window copies version 2 into the
# repository and loads it with POST /v2/repository/models/m/load (version policy latest 1, so
# version 2 replaces 1 while requests are in flight). After the run it checks: zero failed
# requests, the load returned 200, both versions served requests, and the sum over versions of
# nv_inference_request_success on the metrics port equals the client's successful requests
# (warmup included). Prints PASS/FAIL lines; exits non-zero when any check fails.
#
# Environment: DURATION (60), WARMUP (2), SWAP_AT (30), CONCURRENCY (64), BATCH (1),
# PROTOCOLS ("grpc http"), WORK (a fresh temporary directory), KEEP_WORK=1 to keep it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DLREC="${1:-${DLREC:-$ROOT/build-bench/bin/dlrec}}"
DURATION="${DURATION:-60}"
WARMUP="${WARMUP:-2}"
SWAP_AT="${SWAP_AT:-30}"
CONCURRENCY="${CONCURRENCY:-64}"
BATCH="${BATCH:-1}"
PROTOCOLS="${PROTOCOLS:-grpc http}"
WORK="${WORK:-$(mktemp -d /tmp/dlrec-swap.XXXXXX)}"

[[ -x "$DLREC" ]] || { echo "FAIL: dlrec binary not found at $DLREC"; exit 2; }
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

echo "== building the model repository in $WORK"
"$DLREC" datagen --out "$WORK/raw.tsv" --rows 20000 --seed 7 >/dev/null
"$DLREC" etl --input "$WORK/raw.tsv" --out "$WORK/data" >/dev/null
cat >"$WORK/cfg.json" <<'EOF'
{"model": {"arch": "dlrm", "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1],
           "interaction": "dot", "pooling": "sum"},
 "optimizer": {"type": "adagrad", "lr": 0.02},
 "train": {"batch_size": 256, "epochs": 1, "max_steps": 50, "eval_every": 0, "log_every": 100,
           "checkpoint_every": 0, "seed": 1, "device": "cpu"}}
EOF
"$DLREC" train --config "$WORK/cfg.json" --data "$WORK/data" --run "$WORK/run1" --max-steps 40 >/dev/null
"$DLREC" train --config "$WORK/cfg.json" --data "$WORK/data" --run "$WORK/run2" --max-steps 60 >/dev/null
"$DLREC" export --run "$WORK/run1" --out "$WORK/v1" >/dev/null
"$DLREC" export --run "$WORK/run2" --out "$WORK/v2" >/dev/null
echo '{"version_policy": {"latest": {"num_versions": 1}}}' >"$WORK/config.json"

FAILED=0
check() {  # check NAME CONDITION-RESULT(0/1) DETAIL
  if [[ "$2" == 0 ]]; then echo "PASS: $1 ($3)"; else echo "FAIL: $1 ($3)"; FAILED=1; fi
}

# metric_sum NAME MODEL [VERSION]: the sum of a counter over the model's versions.
metric_sum() {
  awk -v n="$1" -v m="$2" -v v="${3:-}" '
    $1 ~ "^"n"[{]" && index($1, "model=\""m"\"") && (v == "" || index($1, "version=\""v"\"")) {
      s += $2 } END { printf "%d\n", s }' "$METRICS_FILE"
}

for PROTO in $PROTOCOLS; do
  echo "== $PROTO: ${DURATION}s at concurrency $CONCURRENCY, batch $BATCH, swap at ${SWAP_AT}s"
  REPO="$WORK/repo-$PROTO"
  rm -rf "$REPO"
  mkdir -p "$REPO/m"
  cp -r "$WORK/v1" "$REPO/m/1"
  cp "$WORK/config.json" "$REPO/m/config.json"
  LOG="$WORK/server-$PROTO.log"
  "$DLREC" serve --model-repository "$REPO" --host 127.0.0.1 --http-port 0 --grpc-port 0 \
    --metrics-port 0 --http-threads $((CONCURRENCY + 16)) >"$LOG" 2>&1 &
  SERVER_PID=$!
  READY=""
  for _ in $(seq 1 120); do  # at most 60 s
    READY="$(grep -m1 'dlrec serve: ready' "$LOG" || true)"
    [[ -n "$READY" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.5
  done
  [[ -n "$READY" ]] || { echo "FAIL: server did not start:"; cat "$LOG"; exit 1; }
  HTTP_PORT="$(sed -E 's/.*HTTP [^ ]*:([0-9]+),.*/\1/' <<<"$READY")"
  GRPC_PORT="$(sed -E 's/.*gRPC [^ ]*:([0-9]+),.*/\1/' <<<"$READY")"
  METRICS_PORT="$(sed -E 's/.*metrics [^ ]*:([0-9]+) .*/\1/' <<<"$READY")"
  echo "   server pid $SERVER_PID: HTTP $HTTP_PORT, gRPC $GRPC_PORT, metrics $METRICS_PORT"
  if [[ "$PROTO" == grpc ]]; then URL="127.0.0.1:$GRPC_PORT"; else URL="127.0.0.1:$HTTP_PORT"; fi

  JSON="$WORK/bench-$PROTO.json"
  BENCH_CMD=("$DLREC" bench serve --protocol "$PROTO" --url "$URL" --model m --batch "$BATCH"
             --concurrency "$CONCURRENCY" --duration "$DURATION" --warmup "$WARMUP"
             --json "$JSON")
  echo "   ${BENCH_CMD[*]}"
  set +e
  "${BENCH_CMD[@]}" >"$WORK/bench-$PROTO.out" 2>&1 &
  BENCH_PID=$!
  set -e

  sleep "$(awk -v a="$WARMUP" -v b="$SWAP_AT" 'BEGIN { print a + b }')"
  # Version 2 appears (atomically: copied under a name that is not a version, then renamed).
  cp -r "$WORK/v2" "$REPO/m/.incoming"
  mv "$REPO/m/.incoming" "$REPO/m/2"
  LOAD_T0=$(date +%s.%N)
  LOAD_STATUS="$(curl -s -o "$WORK/load-$PROTO.out" -w '%{http_code}' --max-time 120 \
    --data '' -X POST "http://127.0.0.1:$HTTP_PORT/v2/repository/models/m/load" || echo 000)"
  LOAD_T1=$(date +%s.%N)
  INDEX="$(curl -s --max-time 10 --data '' -X POST "http://127.0.0.1:$HTTP_PORT/v2/repository/index" || true)"
  echo "   load m -> HTTP $LOAD_STATUS in $(awk -v a="$LOAD_T0" -v b="$LOAD_T1" 'BEGIN { printf "%.2f", b - a }') s; index: $INDEX"

  set +e
  wait "$BENCH_PID"
  BENCH_RC=$?
  set -e
  cat "$WORK/bench-$PROTO.out"

  METRICS_FILE="$WORK/metrics-$PROTO.txt"
  curl -s --max-time 10 "http://127.0.0.1:$METRICS_PORT/metrics" >"$METRICS_FILE" || true
  kill -TERM "$SERVER_PID"
  set +e
  wait "$SERVER_PID"
  SERVER_RC=$?
  set -e
  SERVER_PID=""

  if [[ -s "$JSON" ]]; then
    read -r CLIENT_OK CLIENT_FAIL RPS P50 P99 <<<"$(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(j["total_success"], j["total_failures"], round(j["throughput_rps"], 1),
      j["latency_us"]["p50"], j["latency_us"]["p99"])' "$JSON")"
  else
    CLIENT_OK=-1; CLIENT_FAIL=-1; RPS=0; P50=0; P99=0
  fi
  SRV_OK="$(metric_sum nv_inference_request_success m)"
  SRV_FAIL="$(metric_sum nv_inference_request_failure m)"
  SRV_V1="$(metric_sum nv_inference_request_success m 1)"
  SRV_V2="$(metric_sum nv_inference_request_success m 2)"
  echo "   figures: client success $CLIENT_OK, client failures $CLIENT_FAIL, server success" \
       "$SRV_OK (v1 $SRV_V1, v2 $SRV_V2), server failures $SRV_FAIL, $RPS req/s," \
       "p50 ${P50} us, p99 ${P99} us"
  check "$PROTO: bench exit status" "$([[ $BENCH_RC == 0 ]]; echo $?)" "rc $BENCH_RC"
  check "$PROTO: zero failed requests" "$([[ $CLIENT_FAIL == 0 && $SRV_FAIL == 0 ]]; echo $?)" \
        "client $CLIENT_FAIL, server $SRV_FAIL"
  check "$PROTO: version 2 loaded under load" \
        "$([[ $LOAD_STATUS == 200 ]] && python3 -c '
import json, sys
idx = json.loads(sys.argv[1])
sys.exit(0 if any(e.get("name") == "m" and e.get("version") == "2" and e.get("state") == "READY"
                  for e in idx) else 1)' "$INDEX" 2>/dev/null; echo $?)" \
        "HTTP $LOAD_STATUS"
  check "$PROTO: both versions served" "$([[ $SRV_V1 -gt 0 && $SRV_V2 -gt 0 ]]; echo $?)" \
        "v1 $SRV_V1, v2 $SRV_V2"
  check "$PROTO: metrics success == client success" \
        "$([[ $CLIENT_OK -gt 0 && $SRV_OK == "$CLIENT_OK" ]]; echo $?)" \
        "server $SRV_OK, client $CLIENT_OK"
  check "$PROTO: graceful shutdown" "$([[ $SERVER_RC == 0 ]]; echo $?)" "rc $SERVER_RC"
done

if [[ $FAILED == 0 ]]; then echo "PASS: serve_swap_load"; else echo "FAIL: serve_swap_load"; fi
exit $FAILED
