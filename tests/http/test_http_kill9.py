"""Crash recovery proven by kill -9: the real server under streaming load, killed at random
moments, again and again on one log directory (DESIGN I5, I7)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time

import httpx
import pytest
from server_process import ServerProcess


class StreamingClients:
    """Clients that remember every token the server ever showed them, per rid."""

    def __init__(self, url: str, prefix: str, n: int) -> None:
        self.received: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(url, f"{prefix}-{i}"), daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, url: str, rid_prefix: str) -> None:
        for k in range(1000):
            rid = f"{rid_prefix}-{k}"
            body = {"input_ids": [5 + k % 50, 6, 7, 8], "rid": rid, "stream": True,
                    "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0.8, "seed": k}}
            try:
                with httpx.stream("POST", f"{url}/generate", json=body, timeout=30) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            ids = json.loads(line[6:])["output_ids"]
                            with self.lock:
                                self.received[rid] = ids
            except (httpx.HTTPError, OSError):
                return  # the server is gone

    def join(self) -> None:
        for t in self.threads:
            t.join(60)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ops.cli", *args], capture_output=True, text=True, timeout=300)


def _audit(log_dir) -> dict[str, dict]:
    out = _cli("audit", "--log-dir", str(log_dir), "--json")
    assert out.returncode == 0, out.stderr
    return {row["rid"]: row for row in map(json.loads, out.stdout.splitlines())}


def _kill9_rounds(rounds: int, model_dir, log_dir, seed: int) -> None:
    rng = random.Random(seed)
    received: dict[str, list[int]] = {}
    for n in range(rounds):
        srv = ServerProcess(model_dir, log_dir, "--log-durability", "fsync")
        srv.wait_healthy()
        clients = StreamingClients(srv.url, f"round{n}", 4)
        time.sleep(rng.uniform(0.2, 2.5))
        srv.kill_all()
        clients.join()
        received.update(clients.received)
        verify = _cli("verify", "--log-dir", str(log_dir))
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert "Traceback" not in verify.stderr
        audits = _audit(log_dir)
        for rid, shown in clients.received.items():
            # I5: every token a client saw is in the log, as a prefix of the committed output.
            committed = audits[rid]["output_ids"]
            assert committed[: len(shown)] == shown, rid
    # One more start: recovery marks what the last crash left unfinished as interrupted (I7).
    srv = ServerProcess(model_dir, log_dir)
    srv.wait_healthy()
    assert srv.terminate() == 0
    audits = _audit(log_dir)
    assert all(row["status"] in ("finished", "interrupted") for row in audits.values())
    assert any(row["status"] == "interrupted" for row in audits.values())
    assert all(rid in audits for rid in received)


def test_i5_i7_kill9_under_streaming_load_ten_rounds(tiny_checkpoint, tmp_path):
    _kill9_rounds(10, tiny_checkpoint("llama"), tmp_path / "log", seed=1)


@pytest.mark.slow
def test_i5_i7_kill9_under_streaming_load_hundred_rounds(tiny_checkpoint, tmp_path):
    _kill9_rounds(100, tiny_checkpoint("llama"), tmp_path / "log", seed=2)
