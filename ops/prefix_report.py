"""The shared-prefix benchmark's table (ops/bench_prefix.sh): cache on vs off vs vLLM from the
client's result files, and the cached tokens every request logged in the cache-on run's log."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from commitlog import LogReader
from commitlog.audit import iter_audits

ROWS = (("median TTFT ms", "median_ttft_ms"), ("p99 TTFT ms", "p99_ttft_ms"), ("wall s", "duration"),
        ("output tok/s", "output_throughput"), ("mean TPOT ms", "mean_tpot_ms"))
MIN_CACHED = 1000


def cached_tokens(log_dir: Path) -> list[int]:
    """Each request's logged cached-prefix length, in arrival (BEGIN) order."""
    reader = LogReader.open(log_dir)
    try:
        audits = list(iter_audits(reader, writer_alive=False))
    finally:
        reader.close()
    return [a.cached_tokens for a in sorted(audits, key=lambda a: a.begin_lsn)]


def main(out_dir: Path) -> None:
    runs = {label: json.loads((out_dir / f"{label}.json").read_text())
            for label in ("cache-on", "cache-off", "vllm") if (out_dir / f"{label}.json").exists()}
    labels = list(runs)
    print("| metric | " + " | ".join(labels) + " | on / off |" + (" on / vLLM |" if "vllm" in runs else ""))
    print("| --- |" + " ---: |" * (len(labels) + 1 + ("vllm" in runs)))
    for name, key in ROWS:
        values = [runs[label][key] for label in labels]
        cells = " | ".join(f"{v:,.1f}" for v in values)
        ratio = f" {runs['cache-on'][key] / runs['cache-off'][key]:.2f}× |"
        peer = f" {runs['cache-on'][key] / runs['vllm'][key]:.2f}× |" if "vllm" in runs else ""
        print(f"| {name} | {cells} |{ratio}{peer}")
    cached = cached_tokens(out_dir / "cache-on.log")
    later = cached[1:]
    hits = sum(c >= MIN_CACHED for c in later)
    print(f"\ncached tokens per request (log, arrival order): {cached}")
    print(f"requests after the first with >= {MIN_CACHED} cached tokens: {hits}/{len(later)} "
          f"({100 * hits / max(len(later), 1):.0f}%)")
    on, off = runs["cache-on"], runs["cache-off"]
    print(f"median TTFT {off['median_ttft_ms'] / on['median_ttft_ms']:.1f}× lower, "
          f"wall {off['duration'] / on['duration']:.1f}× lower with the cache")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
