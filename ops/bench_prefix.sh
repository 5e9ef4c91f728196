#!/usr/bin/env bash
# The shared-prefix benchmark, one run: the same client (`vllm bench serve`, dataset
# prefix_repetition: one PREFIX-token system prompt, SUFFIX-token distinct suffixes, N requests at
# CONCURRENCY) loads tokenledger with the prefix cache, tokenledger with --disable-radix-cache, and
# vLLM's CPU build (prefix caching on by default), one after the other on the same checkpoint.
# Then ops/prefix_report.py prints the table and the cached tokens each request logged.
# Never part of `make test`. Usage: ops/bench_prefix.sh [MODEL_DIR]
# Env: PEER_VENV (default .peer-venv; see ops/peer_bench.sh), PREFIX=1024 SUFFIX=32 OUT=32 N=32 CONCURRENCY=8
#      SKIP_PEER=1 to leave vLLM out.
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_VENV=${PEER_VENV:-.peer-venv}
PREFIX=${PREFIX:-1024} SUFFIX=${SUFFIX:-32} OUT=${OUT:-32} N=${N:-32} CONCURRENCY=${CONCURRENCY:-8}
OUT_DIR=${OUT_DIR:-$(mktemp -d -t prefix-bench-XXXX)}
mkdir -p "$OUT_DIR"
make install >/dev/null
MODEL=${1:-$OUT_DIR/ckpt-tiny}
[ -f "$MODEL/config.json" ] || .venv/bin/tokenledger bench checkpoint --out "$MODEL" --preset tiny >/dev/null
PORT=31235
. ops/bench_servers.sh  # wait_healthy, stop
run_client() {  # $1: label
  "$PEER_VENV/bin/python" ops/peer_vllm_bench_serve.py --backend openai --base-url "http://127.0.0.1:$PORT" \
    --endpoint /v1/completions --model "$MODEL" --tokenizer "$MODEL" --dataset-name prefix_repetition \
    --prefix-repetition-prefix-len "$PREFIX" --prefix-repetition-suffix-len "$SUFFIX" \
    --prefix-repetition-num-prefixes 1 --prefix-repetition-output-len "$OUT" --num-prompts "$N" \
    --max-concurrency "$CONCURRENCY" --request-rate inf --ignore-eos --seed 0 \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --save-result \
    --result-dir "$OUT_DIR" --result-filename "$1.json" > "$OUT_DIR/$1.client.log" 2>&1
}
serve_ours() {  # $1: label, then extra flags
  local label=$1; shift
  .venv/bin/tokenledger serve --model-path "$MODEL" --served-model-name "$MODEL" --port $PORT \
    --log-dir "$OUT_DIR/$label.log" --max-running-requests 64 "$@" > "$OUT_DIR/$label.server.log" 2>&1 &
  local pid=$!
  trap "stop $pid" EXIT
  wait_healthy; run_client "$label"; stop $pid
}
serve_ours cache-on
serve_ours cache-off --disable-radix-cache
if [ -z "${SKIP_PEER:-}" ]; then
  VLLM_CPU_KVCACHE_SPACE=2 "$PEER_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
    --dtype float32 --port $PORT > "$OUT_DIR/vllm.server.log" 2>&1 &
  VL=$!; trap 'stop $VL' EXIT
  wait_healthy; run_client vllm; stop $VL
fi
.venv/bin/python -m ops.prefix_report "$OUT_DIR"
