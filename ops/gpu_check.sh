#!/usr/bin/env bash
# tokenledger's CUDA check, in one command, on a machine with a GPU and torch, triton and (optionally)
# flashinfer installed: the gpu-marked tests on the device, then decode tok/s per attention backend,
# as one summary table. Exit 0: all passed; 1: a check failed; 2: no CUDA device here.
# Idempotent: it installs only what the project needs and is missing (never torch, triton or flashinfer:
# the machine's own builds are kept), then runs from this checkout (PYTHONPATH, no editable install).
#   usage: ops/gpu_check.sh [--skip-bench] [--log-dir DIR]      PYTHON=/path/to/python ops/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: $PYTHON has no torch that sees a CUDA device; nothing was checked" >&2
    exit 2
fi

missing="$(mktemp)"
trap 'rm -f "$missing"' EXIT
"$PYTHON" -m ops.gpu_check --missing-deps > "$missing"
if [ -s "$missing" ]; then
    echo "gpu_check: installing what is missing: $(tr '\n' ' ' < "$missing")"
    # Not fatal: an offline machine goes on with what it has, and a check that needs what is missing fails.
    "$PYTHON" -m pip install --quiet --retries 1 --timeout 10 -r "$missing" || echo "gpu_check: could not install them; going on" >&2
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The Python side keeps each step within its budget (< 5 minutes in all); this is the backstop.
exec timeout 330 "$PYTHON" -m ops.gpu_check "$@"
