#!/usr/bin/env bash
# gRPC end to end, two `dlrec serve` binaries side by side on this host (CPU engine, a tiny
# DLRM; ports PORT and PORT+1): each load runs on one and then the other (the order alternates
# by round), with the same client binary.
#
#   bash bench/serve_grpc_ab.sh BEFORE_DLREC AFTER_DLREC
#
# Loads (LOADS, "batch:clients" or "live:1" for ServerLive round trips, the gRPC floor):
# default "live:1 1:1 2048:1 4096:16 4096:32". Each run prints the client's summary line
# prefixed with "round R side". PERF=1: also `perf stat -e context-switches,task-clock` on the
# server during each load, printed as server context switches and CPU microseconds per request.
# CQ=1: also the CPU time of the server's completion-queue threads (grpc-cq*), its parse
# threads (grpc-parse*) and its batcher threads (batcher-w*, with the engine threads they
# start) per request, from
# /proc/<server>/task/*/stat around each load.
# SERVER_ENV: environment for the servers (e.g. "LD_LIBRARY_PATH=..."; CPU threads are the global
# --threads option); SERVER_ARGS: more serve options for both (e.g. "--grpc-threads 2");
# AFTER_ARGS: for the after side only (e.g. "--grpc-inline-rows 4096"). ROUNDS (3),
# DURATION (4 s per load), WORK (/tmp/dlrec_grpc_ab),
# CLIENT (the dlrec whose `bench serve` drives the loads; default AFTER).
#
# Model: `dlrec datagen --rows 5000 --seed 3`, default ETL, DLRM dim 8, bottom 16-8, top 16-1,
# 10 training steps; config.json max_queue_delay 0, max_queue_size 4096 (as in
# bench/serve_gpu_e2e.sh), one CPU instance.
set -u
BEFORE=$(readlink -f "$1")
AFTER=$(readlink -f "$2")
CLIENT=$(readlink -f "${CLIENT:-$AFTER}")
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-4}
LOADS=${LOADS:-"live:1 1:1 2048:1 4096:16 4096:32"}
W=${WORK:-/tmp/dlrec_grpc_ab}
PORT=${PORT:-18101}
mkdir -p "$W"

if [ ! -f "$W/repo/m/1/model.json" ]; then
  "$AFTER" datagen --out "$W/raw.tsv" --rows 5000 --seed 3 > "$W/setup.log" 2>&1
  "$AFTER" etl --input "$W/raw.tsv" --out "$W/data" --overwrite >> "$W/setup.log" 2>&1
  cat > "$W/cfg.json" <<'CFG'
{"model": {"arch": "dlrm", "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1],
           "interaction": "dot", "pooling": "sum"},
 "optimizer": {"type": "adagrad", "lr": 0.02},
 "train": {"batch_size": 256, "epochs": 1, "max_steps": 10, "eval_every": 0, "log_every": 100,
           "checkpoint_every": 0, "seed": 1, "device": "cpu"}}
CFG
  rm -rf "$W/run" "$W/repo"
  "$AFTER" train --config "$W/cfg.json" --data "$W/data" --run "$W/run" >> "$W/setup.log" 2>&1
  "$AFTER" export --run "$W/run" --out "$W/repo/m/1" >> "$W/setup.log" 2>&1 ||
    { echo "export failed"; tail "$W/setup.log"; exit 1; }
  echo '{"max_batch_size": 65536, "dynamic_batching": {"max_queue_delay_microseconds": 0, "max_queue_size": 4096}}' \
    > "$W/repo/m/config.json"
fi

# Both servers run throughout (an idle one sleeps in epoll); each load runs on one, then the
# other, so that the pair sees the same background load (this host is shared).
declare -A server port
for side in before after; do
  bin=$BEFORE
  extra=""
  port[$side]=$PORT
  if [ $side = after ]; then bin=$AFTER; extra=${AFTER_ARGS:-}; port[$side]=$((PORT + 1)); fi
  # shellcheck disable=SC2086
  env ${SERVER_ENV:-} "$bin" serve --model-repository "$W/repo" --grpc-port "${port[$side]}" \
    --http-port -1 --metrics-port -1 ${SERVER_ARGS:-} $extra > "$W/server_$side.log" 2>&1 &
  server[$side]=$!
  for _ in $(seq 1 100); do
    "$CLIENT" bench serve --protocol grpc --url "127.0.0.1:${port[$side]}" --model m --batch 1 \
      --concurrency 1 --duration 0.2 --warmup 0 --rpc live > /dev/null 2>&1 && break
    sleep 0.2
  done
done

# CPU seconds of a server's threads whose name starts with $2, summed.
thread_cpu() {
  for t in /proc/"$1"/task/*; do
    case $(cat "$t/comm" 2>/dev/null) in "$2"*) awk '{print $14 + $15}' "$t/stat" 2>/dev/null;; esac
  done | awk -v hz="$(getconf CLK_TCK)" '{s += $1} END {printf "%.3f\n", s / hz}'
}

for r in $(seq 1 "$ROUNDS"); do
  for load in $LOADS; do
    b=${load%%:*}
    c=${load##*:}
    args=(--batch "$b")
    [ "$b" = live ] && args=(--batch 1 --rpc live)
    sides="before after"
    [ $((r % 2)) = 0 ] && sides="after before"  # alternate which goes first
    for side in $sides; do
      if [ -n "${PERF:-}" ]; then
        perf stat -x, -e context-switches,task-clock -p ${server[$side]} -o "$W/perf.txt" -- \
          sleep $((DURATION + 1)) &
        perf_pid=$!
      fi
      if [ -n "${CQ:-}" ]; then
        cq0=$(thread_cpu ${server[$side]} grpc-cq)
        gp0=$(thread_cpu ${server[$side]} grpc-parse)
        bw0=$(thread_cpu ${server[$side]} batcher-w)
      fi
      line=$("$CLIENT" bench serve --protocol grpc --url "127.0.0.1:${port[$side]}" --model m \
        --model-dir "$W/repo/m/1" --input encoded "${args[@]}" --concurrency "$c" \
        --duration "$DURATION" --warmup 1 2>&1 | grep "^summary")
      echo "round $r $side load=$load $line"
      if [ -n "${CQ:-}" ]; then
        reqs=$(echo "$line" | sed -n 's/.*requests=\([0-9]*\).*/\1/p')
        awk -v a="$cq0" -v b="$(thread_cpu ${server[$side]} grpc-cq)" -v c="$bw0" \
          -v e="$(thread_cpu ${server[$side]} batcher-w)" -v f="$gp0" \
          -v g="$(thread_cpu ${server[$side]} grpc-parse)" -v n="$reqs" -v d="$DURATION" \
          -v side=$side -v load=$load -v r=$r 'BEGIN { k = n * (d + 1) / d; if (k > 0)
            printf "round %s %s load=%s threads: grpc-cq cpu us/req %.1f, batcher-w cpu us/req %.1f, grpc-parse cpu us/req %.1f\n",
              r, side, load, (b - a) * 1e6 / k, (e - c) * 1e6 / k, (g - f) * 1e6 / k }'
      fi
      if [ -n "${PERF:-}" ]; then
        wait $perf_pid
        reqs=$(echo "$line" | sed -n 's/.*requests=\([0-9]*\).*/\1/p')
        cs=$(grep context-switches "$W/perf.txt" | cut -d, -f1)
        ms=$(grep task-clock "$W/perf.txt" | cut -d, -f1)
        # perf counts DURATION + 1 s (the warmup too): requests scaled by (DURATION + 1) / DURATION.
        awk -v cs="$cs" -v ms="$ms" -v n="$reqs" -v d="$DURATION" -v side=$side -v load=$load -v r=$r \
          'BEGIN { k = n * (d + 1) / d; if (k > 0) printf "round %s %s load=%s perf: server cs/req %.2f, server cpu us/req %.1f\n", r, side, load, cs / k, ms * 1000 / k }'
      fi
    done
  done
done
for side in before after; do
  kill -INT ${server[$side]}
  wait ${server[$side]}
done
