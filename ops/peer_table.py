"""The side-by-side table of two `vllm bench serve` result files (tokenledger first, peer second)."""
from __future__ import annotations

import json
import os
import sys

ROWS = (  # (label, key, higher is better)
    ("output tok/s", "output_throughput", True),
    ("total tok/s", "total_token_throughput", True),
    ("mean TTFT ms", "mean_ttft_ms", False),
    ("p99 TTFT ms", "p99_ttft_ms", False),
    ("mean TPOT ms", "mean_tpot_ms", False),
    ("p99 TPOT ms", "p99_tpot_ms", False),
    ("mean ITL ms", "mean_itl_ms", False),
    ("p99 E2E ms", "p99_e2el_ms", False),
)


def main(ours_path: str, peer_path: str) -> None:
    with open(ours_path) as f:
        ours = json.load(f)
    with open(peer_path) as f:
        peer = json.load(f)
    print(f"completed: tokenledger {ours.get('completed')}, vLLM {peer.get('completed')}")
    print("| metric | tokenledger | vLLM | tokenledger / vLLM |")
    print("| --- | ---: | ---: | ---: |")
    for label, key, _ in ROWS:
        a, b = ours.get(key), peer.get(key)
        if a is None or b is None:
            continue
        print(f"| {label} | {a:,.1f} | {b:,.1f} | {a / b:.2f}× |")


# (label, vllm bench serve's key, tokenledger bench serve's (section, key))
AGREEMENT = (
    ("output tok/s", "output_throughput", (None, "output_tok_s")),
    ("mean TTFT ms", "mean_ttft_ms", ("ttft_ms", "mean")),
    ("mean TPOT ms", "mean_tpot_ms", ("tpot_ms", "mean")),
    ("mean ITL ms", "mean_itl_ms", ("itl_ms", "mean")),
    ("p99 E2E ms", "p99_e2el_ms", ("e2e_ms", "p99")),
)


def agreement(out_dir: str) -> None:
    """Each server loaded the same way by both clients in turn — vllm bench serve, ours, vllm bench serve
    again — so ours is compared with the mean of the two runs around it (a machine whose load drifts
    between runs moves both of those, not just one)."""
    print("| server | metric | vllm bench serve (before, after) | tokenledger bench serve | ours / theirs |")
    print("| --- | --- | ---: | ---: | ---: |")
    for server in ("tokenledger", "vllm"):
        runs = [_load(f"{out_dir}/{name}.json") for name in (server, f"{server}-again")
                if os.path.exists(f"{out_dir}/{name}.json")]
        ours = _load(f"{out_dir}/{server}.bench_serve.json")
        for label, key, (section, our_key) in AGREEMENT:
            a = ours[our_key] if section is None else ours[section].get(our_key)
            values = [run[key] for run in runs if run.get(key) is not None]
            if a is None or not values:
                continue
            b = sum(values) / len(values)
            shown = ", ".join(f"{v:,.1f}" for v in values)
            print(f"| {server} | {label} | {b:,.1f} ({shown}) | {a:,.1f} | {a / b:.2f} |")


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


if __name__ == "__main__":
    if sys.argv[1] == "--agreement":
        agreement(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
