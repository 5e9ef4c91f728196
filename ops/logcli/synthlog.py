"""A synthetic but well-formed log of any size, written straight through the commit-log encoder.

Used to measure `verify` on large logs (docs/benchmarks.md "## verify"):
    python -m ops.logcli.synthlog --out /tmp/big --records 1000000
Requests interleave like a batched scheduler's: one COMMIT per running request per step,
with stops, lengths and aborts (ABORT_REQUESTED, a doomed DISCARD, FINISH abort).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from commitlog.codec import Encoder, Entry, Kind
from commitlog.state import Delta
from commitlog.wal import Durability, Wal, WalConfig


@dataclass(slots=True)
class _Live:
    rid: str
    target: int
    abort_at: int | None
    kv: int
    num_out: int = 0
    doomed: bool = False


def _begin(rng: random.Random, n: int, now: int) -> tuple[_Live, Entry]:
    prompt = [rng.randrange(32000) for _ in range(rng.randint(8, 64))]
    target = rng.randint(16, 256)
    abort_at = rng.randint(1, target - 1) if rng.random() < 0.1 else None
    live = _Live(f"req-{n:08d}", target, abort_at, len(prompt))
    params = {"max_new_tokens": target, "temperature": 0.0, "seed": n, "return_logprob": True}
    return live, Entry(Kind.BEGIN, live.rid, {"prompt": prompt, "params": params, "grammar": None, "arrival": now})


def _advance(rng: random.Random, req: _Live, now: int) -> tuple[list[Entry], bool]:
    """This step's entries for one running request, and whether it finished."""
    if req.doomed:
        return [Entry(Kind.DISCARD, req.rid, {"reason": "doomed: client went away"}),
                Entry(Kind.FINISH, req.rid, {"reason": "abort", "matched": None, "n_out": req.num_out, "kv": req.kv})], True
    if req.abort_at is not None and req.num_out == req.abort_at:
        req.doomed = True
        return [Entry(Kind.ABORT_REQUESTED, req.rid, {"reason": "client went away", "source": "disconnect", "t": now})], False
    req.num_out += 1
    req.kv += 1
    token = rng.randrange(32000)
    done = req.num_out == req.target
    fin: list[object] | None = None if not done else (["length", req.target] if token % 2 else ["stop", 2])
    payload = Delta(output_ids=[token], output_logprobs=[-rng.random()], kv_committed_len=req.kv).to_payload()
    payload["fin"] = fin
    entries = [Entry(Kind.COMMIT, req.rid, payload)]
    if fin is not None:
        entries.append(Entry(Kind.FINISH, req.rid, {"reason": fin[0], "matched": fin[1], "n_out": req.num_out,
                                                    "kv": req.kv}))
    return entries, done


def write_log(out: Path, num_records: int, concurrency: int = 32, seed: int = 0) -> int:
    """Write about `num_records` records (a little more, to close every request); return the count."""
    rng = random.Random(seed)
    wal = Wal.open(out, WalConfig(durability=Durability.NONE, initial_map_size=1 << 30))
    encoder = Encoder()
    now = time.time_ns()
    running: list[_Live] = []
    started = 0
    try:
        wal.write_group(encoder.encode([Entry(Kind.SERVER_START, None, {"instance": "synthetic", "pid": 0,
                                                                          "fingerprint": "synthetic"})], now))
        while encoder.next_lsn <= num_records or running:
            now += 20_000_000
            entries: list[Entry] = []
            while encoder.next_lsn + len(entries) <= num_records and len(running) < concurrency:
                live, begin = _begin(rng, started, now)
                started += 1
                running.append(live)
                entries.append(begin)
            still: list[_Live] = []
            for req in running:
                step_entries, done = _advance(rng, req, now)
                entries.extend(step_entries)
                if not done:
                    still.append(req)
            running = still
            if encoder.next_lsn + len(entries) > num_records and not running:
                entries.append(Entry(Kind.SERVER_STOP, None, {"instance": "synthetic"}))
            wal.write_group(encoder.encode(entries, now))
    finally:
        wal.close()
    return encoder.next_lsn - 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.logcli.synthlog", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="a new (empty) log directory")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    n = write_log(args.out, args.records, args.concurrency)
    print(f"wrote {n} records to {args.out} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
