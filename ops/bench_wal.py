"""`tokenledger bench wal`: group-commit throughput and latency of the commit log's writer path.

Measured against raw py-lmdb puts of the very same encoded bytes, in the same run, so the
ratio shows what the writer thread, the per-request index and encoding cost.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lmdb

from commitlog.codec import EncodedGroup, Encoder, Entry, Kind
from commitlog.state import Delta
from commitlog.wal import Durability, Wal, WalConfig
from commitlog.writer import DurableCallback, WalWriter

TABLE_GROUPS = (1, 8, 64, 256)
TABLE_MODES = ("fsync", "none")
TOKENS_PER_RECORD = 4


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("wal", help="commit-log write throughput and group commit latency")
    p.add_argument("--records", type=int, default=20_000, help="records to write (per config with --table)")
    p.add_argument("--group-size", type=int, default=64, help="records per group (one LMDB write txn)")
    p.add_argument("--durability", choices=[d.value for d in Durability], default="fsync")
    p.add_argument("--max-inflight", type=int, default=0,
                   help="wait until at most this many groups are not yet durable before submitting the "
                        "next (0: never wait, like the scheduler; the writer's queue bound applies)")
    p.add_argument("--log-dir", default=None, help="where to write (default: a temporary directory)")
    p.add_argument("--table", action="store_true", help="run group 1/8/64/256 x fsync/none and print a table")
    p.add_argument("--busy-caller", action="store_true",
                   help="measure a CPU-busy caller's step rate with and without the writer thread")
    p.add_argument("--json", action="store_true", help="print only the JSON result line(s)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.records < 1 or args.group_size < 1 or args.max_inflight < 0:
        print("tokenledger bench wal: --records and --group-size must be >= 1, --max-inflight >= 0",
              file=sys.stderr)
        return 2
    root = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="tl-bench-wal-"))
    if args.busy_caller:
        result = busy_caller(root, args.group_size)
    elif args.table:
        rows = [bench(root / f"{mode}-{g}", min(args.records, 400 * g), g, Durability(mode), args.max_inflight)
                for mode in TABLE_MODES for g in TABLE_GROUPS]
        if not args.json:
            print(markdown_table(rows))
        result = {"table": rows}
    else:
        result = bench(root, args.records, args.group_size, Durability(args.durability), args.max_inflight)
    print(json.dumps(result))
    return 0


def make_entries(num_records: int, group_size: int) -> list[list[Entry]]:
    """Decode-step COMMIT records: a few token ids with their logprobs, one per request in the batch."""
    groups = []
    for start in range(0, num_records, group_size):
        entries = []
        for i in range(start, min(start + group_size, num_records)):
            ids = [(i * 7 + k) % 151_000 for k in range(TOKENS_PER_RECORD)]
            delta = Delta(output_ids=ids, output_logprobs=[-0.01 * (k + 1) for k in range(TOKENS_PER_RECORD)],
                          kv_committed_len=512 + i)
            entries.append(Entry(Kind.COMMIT, f"req-{i % 256:04d}-5f0c8e2a9d3b4c1e", delta.to_payload()))
        groups.append(entries)
    return groups


def bench(log_dir: Path, num_records: int, group_size: int, durability: Durability, max_inflight: int) -> dict[str, Any]:
    """records_per_s: the writer path (submit -> durable) on already-encoded groups, the bytes the
    raw baseline puts. Encoding is the caller's (scheduler's) cost and is reported on its own."""
    entries = make_entries(num_records, group_size)
    started = time.perf_counter()
    groups = _encode(entries)
    encode_s = time.perf_counter() - started
    raw_rate = raw_puts_rate(log_dir / "raw", groups, durability)
    rate, latencies = writer_rate(log_dir / "wal", groups, durability, max_inflight)
    latencies.sort()
    return {
        "durability": durability.value, "group_size": group_size, "records": num_records,
        "records_per_s": round(rate), "p50_ms": round(_pct(latencies, 0.50) * 1e3, 3),
        "p99_ms": round(_pct(latencies, 0.99) * 1e3, 3), "raw_records_per_s": round(raw_rate),
        "ratio_to_raw": round(rate / raw_rate, 3),
        "encode_us_per_record": round(encode_s / num_records * 1e6, 2),
        "with_encode_records_per_s": round(num_records / (num_records / rate + encode_s)),
    }


def _encode(entries: list[list[Entry]]) -> list[EncodedGroup]:
    enc = Encoder()
    return [enc.encode(group) for group in entries]


def writer_rate(log_dir: Path, groups: list[EncodedGroup], durability: Durability,
                max_inflight: int) -> tuple[float, list[float]]:
    """The real writer thread, `max_inflight` groups in flight; latency = submit -> durable callback."""
    cfg = WalConfig(durability=durability, sync_interval_ms=10)
    wal = Wal.open(log_dir, cfg)
    writer = WalWriter(wal, cfg)
    latencies: list[float] = []
    started = time.perf_counter()
    for i, group in enumerate(groups):
        if max_inflight and i >= max_inflight:
            writer.wait_durable(groups[i - max_inflight].last_lsn)
        writer.submit(group, _latency_recorder(latencies, time.perf_counter()))
    writer.wait_durable(groups[-1].last_lsn)
    elapsed = time.perf_counter() - started
    writer.close()
    wal.close()
    return sum(len(g.records) for g in groups) / elapsed, latencies


def _latency_recorder(latencies: list[float], submitted: float) -> DurableCallback:
    def record(lsn: int, error: BaseException | None) -> None:
        latencies.append(time.perf_counter() - submitted)
    return record


def raw_puts_rate(log_dir: Path, groups: list[EncodedGroup], durability: Durability) -> float:
    """py-lmdb alone: the same bytes, one write txn per group, append puts, same sync flags."""
    log_dir.mkdir(parents=True, exist_ok=True)
    sync = durability is Durability.FSYNC
    env = lmdb.Environment(str(log_dir), map_size=1 << 32, max_dbs=2, sync=sync, metasync=sync)
    db = env.open_db(b"records")
    started = time.perf_counter()
    for group in groups:
        with env.begin(write=True) as txn, txn.cursor(db) as cur:
            cur.putmulti(group.records, append=True)
    if durability is Durability.PERIODIC:
        env.sync(True)
    elapsed = time.perf_counter() - started
    env.close()
    return sum(len(g.records) for g in groups) / elapsed


def busy_caller(root: Path, group_size: int, seconds: float = 2.0) -> dict[str, Any]:
    """A CPU-bound 'scheduler' loop that logs one group per step: how much does logging slow it?"""
    entries = make_entries(group_size, group_size)[0]
    results = {"group_size": group_size, "seconds": seconds}
    for name in ("no_log", "encode_only", "writer_thread_fsync", "inline_fsync_write"):
        results[f"{name}_steps_per_s"] = round(_busy_loop(root / name, entries, name, seconds))
    results["writer_thread_vs_encode_only"] = round(
        results["writer_thread_fsync_steps_per_s"] / results["encode_only_steps_per_s"], 3)
    return results


def _busy_loop(log_dir: Path, entries: list[Entry], mode: str, seconds: float) -> float:
    cfg = WalConfig(durability=Durability.FSYNC, max_pending_groups=1 << 20)
    wal = Wal.open(log_dir, cfg) if mode in ("writer_thread_fsync", "inline_fsync_write") else None
    writer = WalWriter(wal, cfg) if wal is not None and mode == "writer_thread_fsync" else None
    encoder, steps = Encoder(), 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        _scheduler_work()
        if mode != "no_log":
            group = encoder.encode(entries)
            if writer is not None:
                writer.submit(group)
            elif wal is not None:
                wal.write_group(group)
        steps += 1
    rate = steps / seconds
    if writer is not None:
        writer.close()
    if wal is not None:
        wal.close()
    return rate


def _scheduler_work() -> int:
    """~0.5 ms of pure-Python work, the kind a scheduler step does while holding the GIL."""
    total = 0
    for i in range(4000):
        total += i * i % 7
    return total


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| durability | group | records/s | p50 ms | p99 ms | raw puts records/s | ratio | "
             "encode µs/record | records/s incl. encode |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['durability']} | {r['group_size']} | {r['records_per_s']:,} | {r['p50_ms']} | "
                     f"{r['p99_ms']} | {r['raw_records_per_s']:,} | {r['ratio_to_raw']} | "
                     f"{r['encode_us_per_record']} | {r['with_encode_records_per_s']:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_wal")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["wal", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
