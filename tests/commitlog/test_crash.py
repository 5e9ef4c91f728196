"""SIGKILL a writer at random moments: every group whose durable callback fired survives (I5, I7)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from commitlog import Kind, LogReader

CHILD = Path(__file__).with_name("crash_child.py")
NUM_KILLS = 50


def _run_and_kill(log_dir: Path, seed: int, rng: random.Random) -> list[int]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    proc = subprocess.Popen([sys.executable, str(CHILD), str(log_dir), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first == b"ready\n", (first, proc.stderr.read() if proc.stderr else b"")
    time.sleep(rng.uniform(0.0, 0.04))
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err
    return [int(line) for line in out.split()]


def test_i5_every_group_reported_durable_survives_sigkill_and_the_log_verifies(tmp_path: Path) -> None:
    log_dir, rng = tmp_path / "log", random.Random(1234)
    reported_total = 0
    for i in range(NUM_KILLS):
        durable = _run_and_kill(log_dir, i, rng)
        reader = LogReader.open(log_dir)
        report = reader.verify()  # CRC, contiguity and the whole chain
        if durable:
            assert report.last_lsn >= max(durable), (i, report.last_lsn, max(durable))
            present = {r.lsn for r in reader.records(min(durable), max(durable))}
            assert set(durable) <= present
        reported_total += len(durable)
        reader.close()
    assert reported_total > NUM_KILLS  # the kills did land while groups were being written
    _assert_i7_after_final_recovery(log_dir)


def _assert_i7_after_final_recovery(log_dir: Path) -> None:
    from commitlog_helpers import FAST

    from commitlog import Ledger
    Ledger.open(log_dir, FAST).close()
    reader = LogReader.open(log_dir)
    begins, finishes = set(), {}
    for record in reader.records():
        if record.kind is Kind.BEGIN:
            begins.add(record.rid)
        elif record.kind is Kind.FINISH:
            finishes[record.rid] = finishes.get(record.rid, 0) + 1
    assert set(finishes) == begins and set(finishes.values()) == {1}
    assert reader.live_request_ids() == []
    reader.close()
