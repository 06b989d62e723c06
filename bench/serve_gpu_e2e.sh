#!/usr/bin/env bash
# Issue 5 GPU figures, MLPerf DLRM size (26 Criteo Kaggle tables, dim 128, bottom 512-256-128,
# top 1024-1024-512-256-1; untrained weights), on one GPU host. Logs under $OUT (default ./out).
#   bash bench/serve_gpu_e2e.sh engine   # the engine alone vs PyTorch bf16 from a CUDA graph
#   bash bench/serve_gpu_e2e.sh e2e      # dlrec serve, gRPC on loopback: latency and saturation
#     (GRPC_THREADS=N: the server's --grpc-threads, unset: its default; a list such as "1 2 3"
#      runs the loads against one server per value in turn, after one setup, each line
#      prefixed "grpc_threads=N" (a value may repeat: "1 2 1"); INLINE_ROWS=N: --grpc-inline-rows; SPIN_US=N: --grpc-spin-us;
#      SERVE_ARGS='...': more flags for dlrec serve; SATURATION_ONLY=1: the saturation loads only; DURATION=S: seconds per load, default 10;
#      SETUP_BIN=path: the dlrec that makes the data and the model, default $BIN/dlrec;
#      REUSE=1: keep the data and the model in $WORK after the run and use them if there
#      (several configurations compared on one host without redoing the setup);
#      MODEL_CONFIG=path (default configs/mlperf_dlrm.json), KIND=KIND_CPU (fp32 on the CPU: a
#      check of the script on a machine without a GPU, with a small MODEL_CONFIG);
#      CLIENT_SPIN_US=N: the load generator's --grpc-spin-us (it polls for its answers);
#      each load also prints the server's own p50/p99 from its duration histogram, "server
#      p50<=A p99<=B us" = the upper bounds of the buckets holding them)
#   bash bench/serve_gpu_e2e.sh profile  # the engine's device time per phase (eager, one stream)
#                                        # and predict() with other chunk sizes
# Binaries from $BIN (default .gpu/bin); scratch in $WORK (default /tmp/dlrec_serve_e2e).
set -u
OUT=${OUT:-out}
BIN=${BIN:-.gpu/bin}
W=${WORK:-/tmp/dlrec_serve_e2e}
mkdir -p "$OUT" "$W"
for part in "$@"; do
  case $part in
    engine)
      "$BIN/dlrec" bench infer --device cuda --precision bf16 --batch 1,2048,32768 --iters 500 \
        --warmup 50 2>&1 | tee "$OUT/engine_dlrec.log" | grep "^bench"
      python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 \
        2>&1 | tee "$OUT/engine_pytorch.log" | grep "^pytorch"
      python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 \
        --no-copies 2>&1 | tee -a "$OUT/engine_pytorch.log" | grep "^pytorch"
      ;;
    profile)
      for B in 1 2048 32768; do
        DLREC_PROFILE=1 "$BIN/dlrec" bench infer --device cuda --precision bf16 --batch $B \
          --iters 200 --warmup 20 > "$OUT/profile_infer_$B.log" 2>&1
        grep "profile\]" "$OUT/profile_infer_$B.log"
      done
      # (The chunk-size sweep that followed here used DLREC_INFER_CHUNK, now the C++ option
      # GraphCudaOptions::infer_chunk, which `dlrec bench infer` does not expose.)
      ;;
    e2e)
      if [ -n "${REUSE:-}" ] && [ -f "$W/repo/dlrm/config.json" ]; then
        echo "reusing the model in $W/repo (REUSE=1)"
      else
        SB=${SETUP_BIN:-$BIN/dlrec}  # makes the data and the model (SETUP_BIN: another build)
        "$SB" datagen --out "$W/logs.tsv" --rows 100000 > "$OUT/e2e_setup.log" 2>&1
        "$SB" etl --input "$W/logs.tsv" --out "$W/data" --overwrite \
          --workflow configs/etl_criteo_kaggle_hash.json >> "$OUT/e2e_setup.log" 2>&1
        rm -rf "$W/repo"
        mkdir -p "$W/repo/dlrm"
        "$SB" export --init "${MODEL_CONFIG:-configs/mlperf_dlrm.json}" --data "$W/data" --out "$W/repo/dlrm/1" \
          >> "$OUT/e2e_setup.log" 2>&1 || { echo "export failed"; tail "$OUT/e2e_setup.log"; exit 1; }
        K=${KIND:-KIND_GPU}
        cat > "$W/repo/dlrm/config.json" <<CFG
  {"max_batch_size": 65536,
   "dynamic_batching": {"preferred_batch_size": [32768], "max_queue_delay_microseconds": 0,
                        "max_queue_size": 4096},
   "instance_group": [{"kind": "$K", "count": ${INSTANCES:-2}$([ "$K" = KIND_GPU ] && echo ', "gpus": [0]')}]$([ "$K" = KIND_GPU ] && echo ',
   "precision": "bf16"')}
CFG
      fi
      D=${DURATION:-10}
      n=0
      for G in ${GRPC_THREADS:-default}; do
        n=$((n + 1))
        tag=""  # several servers: logs e2e_*_g<N>_<k>.log (k-th server of the list)
        [ "${GRPC_THREADS:-}" != "" ] && [ "$(echo $GRPC_THREADS | wc -w)" -gt 1 ] && tag="_g${G}_$n"
        gflag=()
        [ "$G" != default ] && gflag=(--grpc-threads "$G")
        "$BIN/dlrec" serve --model-repository "$W/repo" --grpc-port 18001 --http-port 18000 \
          --metrics-port 18002 "${gflag[@]}" \
          ${INLINE_ROWS:+--grpc-inline-rows "$INLINE_ROWS"} ${SPIN_US:+--grpc-spin-us "$SPIN_US"} \
          ${SERVE_ARGS:-} > "$OUT/e2e_server$tag.log" 2>&1 &
        SERVER=$!
        for i in $(seq 1 240); do
          kill -0 $SERVER 2>/dev/null || { echo "the server exited:"; tail -5 "$OUT/e2e_server$tag.log"; break; }
          python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:18000/v2/models/dlrm/ready', timeout=1)" 2>/dev/null && break
          sleep 0.5
        done
        echo "grpc_threads=$G: server ready after ~$((i / 2)) s"
        # CPU seconds of the server's threads by name (grpc-cq<i>, batcher-w<i>, ...; a thread
        # started by a named one, e.g. the CPU engine's pool, carries its name).
        thread_cpu() {
          for t in /proc/$SERVER/task/*; do
            echo "$(tr ' ' _ < "$t/comm") $(awk '{print $14 + $15}' "$t/stat")"
          done | awk -v hz="$(getconf CLK_TCK)" '{a[$1] += $2} END {for (k in a) print k, a[k] / hz}' | sort
        }
        scrape() {  # the server's request-duration histogram (cumulative buckets, all models)
          python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:18002/metrics').read().decode())" 2>/dev/null \
            | grep '^dlrec_inference_request_duration_us_bucket' | sed 's/.*le="\([^"]*\)"} /\1 /' \
            | awk '{a[$1] += $2} END {for (k in a) print k, a[k]}'
        }
        server_quantiles() {  # before after -> "server p50<=A p99<=B us (N requests)"
          join <(sort "$1") <(sort "$2") | awk '$1 != "+Inf" {print $1, $3 - $2} $1 == "+Inf" {inf = $3 - $2}
            END {print "+Inf", inf}' | sort -g | awk '{le[NR] = $1; c[NR] = $2; n = $2}
            END { if (n == 0) { print "server: no requests"; exit }
                  for (i = 1; i <= NR; i++) { if (!a && c[i] >= 0.5 * n) a = le[i]; if (!b && c[i] >= 0.99 * n) b = le[i] }
                  printf "server p50<=%s p99<=%s us (%d requests)\n", a, b, n }'
        }
        run() {  # batch concurrency seconds [more bench serve options]
          thread_cpu > "$W/cpu0"
          scrape > "$W/h0"
          local t0=$(date +%s.%N)
          "$BIN/dlrec" bench serve --protocol grpc --url 127.0.0.1:18001 --model dlrm \
            --model-dir "$W/repo/dlrm/1" --input encoded --batch "$1" --concurrency "$2" \
            --duration "$3" --warmup 2 --variants 8 ${CLIENT_SPIN_US:+--grpc-spin-us "$CLIENT_SPIN_US"} \
            "${@:4}" 2>&1 | tee -a "$OUT/e2e_client$tag.log" \
            | grep -v "^\[" | sed "s/^/grpc_threads=$G /"
          thread_cpu > "$W/cpu1"
          scrape > "$W/h1"
          echo "grpc_threads=$G batch=$1 concurrency=$2 $(server_quantiles "$W/h0" "$W/h1")" | tee -a "$OUT/e2e_server_quantiles.log"
          # Busy share of each server thread over the run (warmup included): a grpc-cq thread
          # near 100 % is the bottleneck (then try more GRPC_THREADS).
          join "$W/cpu0" "$W/cpu1" | awk -v s="$(awk -v a="$t0" -v z="$(date +%s.%N)" 'BEGIN { print z - a }')" -v b="$1" -v c="$2" -v g="$G" \
            '{ u = ($3 - $2) / s * 100; if (u >= 1) line = line sprintf(" %s %.0f%%", $1, u) }
             END { print "grpc_threads=" g " threads batch=" b " concurrency=" c ":" line }' | tee -a "$OUT/e2e_threads.log"
        }
        if [ -n "${SATURATION_ONLY:-}" ]; then  # the saturation loads alone
          run 4096 32 "$D"; run 16384 16 "$D"; run 16384 32 "$D"
        else
          run 1 1 5 --rpc live  # the gRPC floor: ServerLive round trips, no model
          run 1 1 "$D"
          run 2048 1 "$D"
          run 4096 32 "$D"
          run 16384 16 "$D"
          run 16384 32 "$D"
          python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:18002/metrics').read().decode())" \
            > "$OUT/e2e_metrics$tag.txt" 2>&1
        fi
        kill -INT $SERVER; wait $SERVER
      done
      [ -n "${REUSE:-}" ] || rm -rf "$W"
      ;;
  esac
done
