# Sourced by the side-by-side benchmark scripts (ops/peer_bench.sh, ops/bench_prefix.sh): waiting
# for a server on $PORT to answer /health, and stopping one by pid.
wait_healthy() {
  for _ in $(seq 600); do curl -sf "localhost:$PORT/health" >/dev/null && return 0; sleep 1; done
  echo "server did not come up" >&2; return 1
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
