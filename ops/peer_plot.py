"""The concurrency sweep of `ops/peer_bench.sh` (SWEEP=...): a table and a PNG of output tok/s and p99
TPOT against concurrency, tokenledger beside vLLM. Usage: python -m ops.peer_plot OUT_DIR 1 4 16 64"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SERVERS = ("tokenledger", "vllm")


def load(out_dir: Path, levels: list[int]) -> dict[str, list[dict]]:
    return {s: [json.loads((out_dir / f"{s}-c{c}.json").read_text()) for c in levels] for s in SERVERS}


def table(levels: list[int], runs: dict[str, list[dict]]) -> str:
    lines = ["| concurrency | tokenledger tok/s | vLLM tok/s | ratio | tokenledger p99 TPOT ms | vLLM p99 TPOT ms | ratio |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c, ours, peer in zip(levels, runs["tokenledger"], runs["vllm"]):
        a, b = ours["output_throughput"], peer["output_throughput"]
        x, y = ours["p99_tpot_ms"], peer["p99_tpot_ms"]
        lines.append(f"| {c} | {a:,.0f} | {b:,.0f} | {a / b:.2f}× | {x:.1f} | {y:.1f} | {x / y:.2f}× |")
    return "\n".join(lines)


def plot(levels: list[int], runs: dict[str, list[dict]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, tpot) = plt.subplots(1, 2, figsize=(10, 4))
    for server, style in zip(SERVERS, ("o-", "s--")):
        tput.plot(levels, [r["output_throughput"] for r in runs[server]], style, label=server)
        tpot.plot(levels, [r["p99_tpot_ms"] for r in runs[server]], style, label=server)
    for ax, title in ((tput, "output tok/s (higher is better)"), (tpot, "p99 TPOT ms (lower is better)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("max concurrency")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str]) -> None:
    out_dir, levels = Path(argv[0]), [int(c) for c in argv[1:]]
    runs = load(out_dir, levels)
    print(table(levels, runs))
    png = out_dir / "concurrency.png"
    try:
        plot(levels, runs, png)
        print(f"plot: {png}")
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): table only")


if __name__ == "__main__":
    main(sys.argv[1:])
