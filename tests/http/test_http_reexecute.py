"""Issue 14's done-when, end to end: a log written by the real HTTP server under concurrent load
(greedy and seeded sampling, chunked prefill, overlap, two aborts, a stop string) is proven by
`tokenledger replay --reexecute` in a fresh interpreter (exit 0), and refused with other weights of
the same shape (exit 1); neither prints a traceback."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from server_process import ServerProcess

from server.models.demo import CheckpointSpec, build_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _post(server: ServerProcess, body: dict[str, Any], out: dict[str, Any]) -> None:
    r = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    out[body["rid"]] = r.json() if r.status_code == 200 else r.text


def _when_decoding(server: ServerProcess, rid: str, timeout: float = 60) -> None:
    """Returns once the log shows `rid` has committed a token: an abort then lands mid-decode."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = httpx.get(f"{server.url}/requests/{rid}", timeout=10)
        if r.status_code == 200 and r.json().get("completion_tokens", 0) >= 1:
            return
        time.sleep(0.02)


def _load(server: ServerProcess) -> dict[str, Any]:
    out: dict[str, Any] = {}
    bodies = []
    for i in range(24):
        sampling = {"temperature": 0.8, "seed": 50 + i} if i % 2 else {"temperature": 0}
        bodies.append({"rid": f"h{i}", "input_ids": [(11 * i + j) % 400 + 5 for j in range(8 + 9 * (i % 9))],
                       "sampling_params": {"max_new_tokens": 8 + i % 5, "ignore_eos": True, **sampling},
                       "return_logprob": True})
    bodies.append({"rid": "stop", "input_ids": [40, 41, 42, 43, 44],
                   "sampling_params": {"max_new_tokens": 32, "temperature": 0, "stop": ["e"]}})
    for rid in ("victim-1", "victim-2"):
        bodies.append({"rid": rid, "input_ids": list(range(200, 290)),
                       "sampling_params": {"max_new_tokens": 1900, "temperature": 0, "ignore_eos": True}})
    threads = [threading.Thread(target=_post, args=(server, b, out)) for b in bodies]
    for t in threads:
        t.start()
    for rid in ("victim-1", "victim-2"):
        _when_decoding(server, rid)
        httpx.post(f"{server.url}/abort_request", json={"rid": rid}, timeout=30)
    for t in threads:
        t.join(180)
    return out


def _reexecute(log: Path, *extra: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ops.logcli", "replay", "--log-dir", str(log), "--reexecute",
                           *map(str, extra)], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_log_of_the_http_server_under_load_is_proven_and_other_weights_are_refused(
        tiny_checkpoint: Any, tmp_path: Path) -> None:
    server = ServerProcess(tiny_checkpoint("llama"), tmp_path / "log", "--chunked-prefill-size", "32")
    server.wait_healthy()
    try:
        out = _load(server)
    finally:
        assert server.terminate() == 0, server.stderr()
    assert len(out) == 27 and all(isinstance(v, dict) for v in out.values()), {k: v for k, v in out.items()
                                                                               if not isinstance(v, dict)}
    assert [out[r]["meta_info"]["finish_reason"]["type"] for r in ("victim-1", "victim-2")] == ["abort", "abort"]
    proven = _reexecute(tmp_path / "log")
    assert proven.returncode == 0, proven.stdout + proven.stderr
    assert "27 proven, 0 diverged, 0 not re-executable" in proven.stdout
    other = build_checkpoint(tmp_path / "other", CheckpointSpec(architecture="LlamaForCausalLM", seed=23))
    refused = _reexecute(tmp_path / "log", "--model-path", other)
    assert refused.returncode == 1 and "first divergence:" in refused.stdout, refused.stdout + refused.stderr
    assert "Traceback" not in proven.stderr + refused.stderr
