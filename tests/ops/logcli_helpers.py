"""Helpers for the post-mortem CLI tests: run a command in-process, hand-write logs."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commitlog import Encoder, Entry, Kind
from commitlog.state import Delta, FinishReason
from commitlog.wal import Durability, Wal, WalConfig

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Ran:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


def cli(*argv: str | Path) -> Ran:
    """`tokenledger ...` in this process (the log reads still run in forked children)."""
    from ops.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return Ran(rc, out.getvalue(), err.getvalue())


def cli_subprocess(*argv: str | Path, timeout: float = 60) -> Ran:
    """The torch-free entry in a fresh interpreter: proves no traceback reaches the terminal."""
    proc = subprocess.run([sys.executable, "-m", "ops.logcli", *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def begin(rid: str, prompt: list[int] | None = None) -> Entry:
    return Entry(Kind.BEGIN, rid, {"prompt": prompt or [1, 2, 3], "params": {"max_new_tokens": 8, "seed": 0},
                                   "grammar": None, "arrival": 0})


def commit(rid: str, ids: list[int], wm: int | None = None, lp: list[float] | None = None,
           fin: FinishReason | None = None, matched: Any = None, cached: int = 0) -> Entry:
    delta = Delta(output_ids=ids, output_logprobs=[-0.5] * len(ids) if lp is None else lp, kv_committed_len=wm,
                  finish_reason=fin, finish_matched=matched, cached_tokens=cached)
    return Entry(Kind.COMMIT, rid, delta.to_payload())


def finish(rid: str, reason: str, n_out: int, kv: int, matched: Any = None) -> Entry:
    return Entry(Kind.FINISH, rid, {"reason": reason, "matched": matched, "n_out": n_out, "kv": kv})


def abort(rid: str, source: str = "api") -> Entry:
    return Entry(Kind.ABORT_REQUESTED, rid, {"reason": "client asked", "source": source, "t": 0})


def discard(rid: str) -> Entry:
    return Entry(Kind.DISCARD, rid, {"reason": "doomed: client asked"})


def server(kind: Kind) -> Entry:
    return Entry(kind, None, {"instance": "x", "pid": 0, "fingerprint": ""})


def write_log(log_dir: Path, groups: list[list[Entry]], encoder: Encoder | None = None) -> Encoder:
    """Write each group as one LMDB txn, exactly as the writer would (index, live table)."""
    enc = encoder or Encoder()
    wal = Wal.open(log_dir, WalConfig(durability=Durability.NONE))
    try:
        for group in groups:
            wal.write_group(enc.encode(group))
    finally:
        wal.close()
    return enc


def good_request(rid: str, num_tokens: int = 3) -> list[Entry]:
    entries = [begin(rid)]
    for i in range(num_tokens):
        last = i == num_tokens - 1
        entries.append(commit(rid, [10 + i], wm=4 + i, fin=FinishReason.LENGTH if last else None,
                              matched=num_tokens if last else None))
    return entries + [finish(rid, "length", num_tokens, 3 + num_tokens, num_tokens)]


def write_pristine_log(log_dir: Path) -> Path:
    """A sound log of 40 finished requests between SERVER_START and SERVER_STOP: the base the damage tests corrupt."""
    write_log(log_dir, [[server(Kind.SERVER_START)]] + [good_request(f"req-{i}", 4) for i in range(40)]
              + [[server(Kind.SERVER_STOP)]])
    return log_dir


def record_values(log_dir: Path) -> dict[int, bytes]:
    """Every stored value of the records table by LSN, read raw (no decoding, no checks)."""
    from commitlog import LogReader

    reader = LogReader.open(log_dir)
    try:
        with reader.wal.env.begin() as txn:
            return {int.from_bytes(k, "big"): bytes(v) for k, v in txn.cursor(reader.wal.records)}
    finally:
        reader.close()
