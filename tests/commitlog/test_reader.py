"""Reading a log: by LSN, by request, following the tail from another process; rebuilding a request."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from commitlog_helpers import sync_flush

from commitlog import (
    CommitLogError,
    DoomSource,
    Durability,
    FinishReason,
    Kind,
    Ledger,
    LogReader,
    UnknownRequestError,
    WalConfig,
)

FOLLOWER = """
import sys, threading
from commitlog import LogReader
reader = LogReader.open(sys.argv[1])
target, seen = int(sys.argv[2]), 0
print("ready", flush=True)
for record in reader.follow(poll_s=0.005):
    assert record.lsn == seen + 1, (record.lsn, seen)
    seen = record.lsn
    if seen >= target:
        break
print("verified", reader.verify().num_records, flush=True)
"""


def test_reader_in_another_process_follows_while_the_writer_writes_and_grows_the_map(log_dir: Path) -> None:
    cfg = WalConfig(durability=Durability.NONE, initial_map_size=64 << 10)
    ledger = Ledger.open(log_dir, cfg)  # SERVER_START is LSN 1
    num_groups, per_group = 150, 8
    target = 1 + num_groups * (per_group + 2)
    proc = subprocess.Popen([sys.executable, "-c", FOLLOWER, str(log_dir), str(target)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for g in range(num_groups):
            ledger.begin(f"r{g}", list(range(64)), {"max_new_tokens": per_group})
            step = ledger.step()
            for i in range(per_group):
                txn = step.open(f"r{g}")
                txn.append_token(i, -0.1 * i, [(i, -0.1 * i)] * 4)
                txn.commit()
            ledger.finish(f"r{g}", FinishReason.LENGTH)
            step.flush()
            time.sleep(0.001)
        out, err = proc.communicate(timeout=30)
        grown = ledger.read(lambda r: r.wal.env.info()["map_size"])
    finally:
        proc.kill()
        ledger.close()
    assert proc.returncode == 0, err
    assert out.split()[-2] == "verified" and int(out.split()[-1]) >= target
    assert grown > 64 << 10  # the follower had to adopt a map resized by the writer


def test_rebuild_returns_prompt_params_outputs_logprobs_finish_discards_and_abort(ledger: Ledger) -> None:
    live = ledger.begin("r", [5, 6], {"temperature": 0.7, "stop": ["\n"]})
    for i, keep in enumerate([True, False, True]):
        txn = ledger.txn("r")
        txn.append_token(100 + i, -0.1 * i, [(100 + i, -0.1 * i), (1, -3.0)])
        txn.commit() if keep else txn.rollback("speculative draft rejected")
    ledger.doom("r", "client abort", DoomSource.API)
    txn = ledger.txn("r")
    txn.append_token(999, -0.01)
    txn.commit()
    sync_flush(ledger)
    rebuilt = ledger.read(lambda r: r.rebuild("r"))
    assert rebuilt == live
    assert rebuilt.prompt_ids == [5, 6] and rebuilt.sampling_params == {"temperature": 0.7, "stop": ["\n"]}
    assert rebuilt.output_ids == [100, 102] and rebuilt.output_logprobs == [0.0, -0.2]
    assert rebuilt.discards == ["speculative draft rejected", "doomed: client abort"]
    assert rebuilt.finish_reason is FinishReason.ABORT and rebuilt.abort_time_ns == live.abort_time_ns


def test_records_by_lsn_range_and_by_request(ledger: Ledger) -> None:
    for rid in ("a", "b"):
        ledger.begin(rid, [1], {})
    sync_flush(ledger)
    for rid in ("a", "b", "a"):
        txn = ledger.txn(rid)
        txn.append_token(1)
        txn.commit()
    sync_flush(ledger)
    by_range = ledger.read(lambda r: [(x.lsn, x.kind, x.rid) for x in r.records(2, 4)])
    assert by_range == [(2, Kind.BEGIN, "a"), (3, Kind.BEGIN, "b"), (4, Kind.COMMIT, "a")]
    assert ledger.read(lambda r: r.request_lsns("a")) == [2, 4, 6]
    assert ledger.read(lambda r: sorted(r.request_ids())) == ["a", "b"]
    assert ledger.read(lambda r: r.live_request_ids()) == ["a", "b"]


def test_rebuild_of_an_unknown_request_is_a_typed_error(ledger: Ledger) -> None:
    with pytest.raises(UnknownRequestError, match="no BEGIN"):
        ledger.read(lambda r: r.rebuild("ghost"))


def test_opening_a_missing_log_read_only_says_so(tmp_path: Path) -> None:
    with pytest.raises(CommitLogError, match="no log at"):
        LogReader.open(tmp_path / "nowhere")
