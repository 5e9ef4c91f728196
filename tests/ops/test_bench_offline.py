"""`tokenledger bench offline` runs its workloads through the Engine and HF static batching (and a
vLLM peer) in alternating rounds and times batch-1 decode, reporting each figure (its speed is
measured in docs/benchmarks.md, never asserted here)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_offline_alternates_the_engines_in_rounds_and_reports_the_median_of_their_ratios(tiny_checkpoint):
    """Throughput and batch-1 decode for the Engine and HF, each round through both in turn."""
    ran = subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", "offline", "--model-path", str(tiny_checkpoint("llama")),
         "--num-prompts", "3", "--input-range", "4", "12", "--output-range", "2", "5", "--batch1-tokens", "4",
         "--rounds", "3", "--log-durability", "none"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "batch-1 decode" in ran.stdout
    figures = json.loads(ran.stdout.strip().splitlines()[-1])
    rounds = figures["rounds"]
    assert len(rounds) == 3 and all(set(r) == {"tokenledger", "hf_static"} for r in rounds)
    assert all(rate > 0 for r in rounds for rate in r.values())
    # Each round draws its own prompts: the same shape, other tokens (no prefix cache serves a later round).
    assert len(figures["output_tokens"]) == 3
    per_round = sorted(r["tokenledger"] / r["hf_static"] for r in rounds)
    assert figures["ratios"]["hf_static"] == pytest.approx(per_round[1])
    assert figures["output_tok_s"]["tokenledger"] == pytest.approx(sorted(r["tokenledger"] for r in rounds)[1])
    assert len(figures["batch1_rounds"]) == 3
    b1 = sorted(r["tokenledger"] / r["hf_static"] for r in figures["batch1_rounds"])
    assert figures["batch1_ratios"]["hf_static"] == pytest.approx(b1[1])


FAKE_PEER = """
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--model"); p.add_argument("--warmup"); p.add_argument("--result-fd", type=int)
a = p.parse_args()
out = os.fdopen(a.result_fd, "w", buffering=1)
out.write(json.dumps({"ready": True}) + "\\n")
for line in sys.stdin:
    work = json.loads(line)
    if len(work["prompts"]) > 1:
        print("peer: cannot run this", file=sys.stderr)
        sys.exit(3)
    out.write(json.dumps({"output_tok_s": 7.0, "output_tokens": sum(work["output_lens"]), "seconds": 1.0}) + "\\n")
"""


def _state(pid: int) -> str:
    """The process's state letter (T: stopped by a signal)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_vllm_peer_stays_loaded_and_stopped_between_rounds_and_a_failed_peer_is_reported_with_its_log(tmp_path, monkeypatch):
    from contextlib import ExitStack

    from ops import bench_offline

    fake = tmp_path / "fake_peer.py"
    fake.write_text(FAKE_PEER)
    monkeypatch.setattr(bench_offline, "PEER_SCRIPT", fake)
    one = bench_offline.Workload([[1, 2, 3]], [4])
    with ExitStack() as stack:
        peer = bench_offline.VLLMOffline(stack, sys.executable, tmp_path, one)
        assert _state(peer.proc.pid) == "T"  # stopped outside its turns: an idle peer polls, taking CPU
        assert [peer.output_tok_s(one) for _ in range(2)] == [7.0, 7.0]  # one process, two rounds
        assert _state(peer.proc.pid) == "T"
        with pytest.raises(RuntimeError, match=r"(?s)exit 3\).*peer: cannot run this"):
            peer.output_tok_s(bench_offline.Workload([[1], [2]], [1, 1]))


# A peer with a worker process in its process group, as vLLM's engine core is: idle, it polls.
FAKE_PEER_WITH_WORKER = """
import argparse, json, os, subprocess, sys
p = argparse.ArgumentParser()
p.add_argument("--model"); p.add_argument("--warmup"); p.add_argument("--result-fd", type=int)
a = p.parse_args()
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(os.environ["WORKER_PID_FILE"], "w").write(str(worker.pid))
out = os.fdopen(a.result_fd, "w", buffering=1)
out.write(json.dumps({"ready": True}) + "\\n")
for line in sys.stdin:
    work = json.loads(line)
    out.write(json.dumps({"output_tok_s": 7.0, "output_tokens": sum(work["output_lens"]), "seconds": 1.0}) + "\\n")
worker.kill()
"""


def test_the_peer_pause_waits_until_every_process_of_its_group_shows_stopped(tmp_path, monkeypatch):
    """The next engine's timed round must not start beside the peer's engine core still running: the
    pause polls each member of the peer's process group, not the main process alone."""
    from contextlib import ExitStack

    from ops import bench_offline

    fake = tmp_path / "fake_peer.py"
    fake.write_text(FAKE_PEER_WITH_WORKER)
    monkeypatch.setattr(bench_offline, "PEER_SCRIPT", fake)
    monkeypatch.setenv("WORKER_PID_FILE", str(tmp_path / "worker.pid"))
    one = bench_offline.Workload([[1, 2, 3]], [4])
    with ExitStack() as stack:
        peer = bench_offline.VLLMOffline(stack, sys.executable, tmp_path, one)
        worker = int((tmp_path / "worker.pid").read_text())
        assert set(bench_offline._process_group(peer.proc.pid)) == {peer.proc.pid, worker}
        assert _state(worker) == "T" and _state(peer.proc.pid) == "T"
        # A member slow to show its stop holds the pause until it does.
        polled: list[int] = []
        real_state = bench_offline._process_state

        def worker_slow_to_stop(pid: int) -> str | None:
            polled.append(pid)
            return "R" if pid == worker and polled.count(worker) <= 3 else real_state(pid)

        monkeypatch.setattr(bench_offline, "_process_state", worker_slow_to_stop)
        assert peer.output_tok_s(one) == 7.0
        assert polled.count(worker) == 4  # asked until it showed stopped, then no more
        assert _state(worker) == "T"
