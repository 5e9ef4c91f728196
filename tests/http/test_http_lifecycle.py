"""Auth, shutdown under load, and a scheduler that dies: the server never hangs."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
from server_process import ServerProcess

from commitlog import LogReader


def test_api_key_guards_every_route_but_health_and_admin_routes_need_the_admin_key(tiny_checkpoint, tmp_path):
    srv = ServerProcess(tiny_checkpoint("llama"), tmp_path / "log", "--api-key", "sesame", "--admin-api-key", "root")
    srv.wait_healthy()
    try:
        body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(f"{srv.url}/generate", json=body).status_code == 401
        assert httpx.post(f"{srv.url}/generate", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(f"{srv.url}/v1/models").status_code == 401
        assert httpx.get(f"{srv.url}/metrics").status_code == 401
        user = {"Authorization": "Bearer sesame"}
        assert httpx.post(f"{srv.url}/generate", json=body, headers=user, timeout=60).status_code == 200
        assert httpx.get(f"{srv.url}/health").status_code == 200
        assert httpx.post(f"{srv.url}/abort_request", json={"abort_all": True}, headers=user).status_code == 401
        admin = {"Authorization": "Bearer root"}
        assert httpx.post(f"{srv.url}/abort_request", json={"abort_all": True}, headers=admin).status_code == 200
    finally:
        assert srv.terminate() == 0


def test_sigterm_under_load_exits_0_within_grace_and_leaves_a_log_that_verifies(tiny_checkpoint, tmp_path):
    srv = ServerProcess(tiny_checkpoint("llama"), tmp_path / "log", "--shutdown-grace-s", "3")
    srv.wait_healthy()

    def stream(i: int) -> str:
        body = {"input_ids": [5 + i, 6, 7], "stream": True,
                "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
        try:
            with httpx.stream("POST", f"{srv.url}/generate", json=body, timeout=120) as r:
                last = ""
                for line in r.iter_lines():
                    last = line or last
                return last
        except httpx.HTTPError as exc:
            return f"error {exc}"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream, i) for i in range(8)]
        time.sleep(2)
        started = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        code = srv.proc.wait(60)
        elapsed = time.monotonic() - started
        results = [f.result() for f in futures]
    assert code == 0, srv.stderr()
    assert elapsed < 20  # the 3 s grace, then the rest is aborted and logged
    assert "Traceback" not in srv.stderr()
    reader = LogReader.open(srv.log_dir)
    try:
        report = reader.verify()
        kinds = [r.kind.name for r in reader.records(max(1, report.last_lsn - 3))]
        assert kinds[-1] == "SERVER_STOP"
        assert reader.live_request_ids() == []  # every BEGIN got its FINISH
    finally:
        reader.close()
    # Every stream ended properly: finished, or aborted by the shutdown with its final chunk.
    assert all(r == "data: [DONE]" for r in results), results


def test_scheduler_death_gives_503_and_a_nonzero_exit_not_a_hang(tiny_checkpoint, tmp_path):
    srv = ServerProcess(tiny_checkpoint("llama"), tmp_path / "log")
    srv.wait_healthy()
    pending = concurrent.futures.ThreadPoolExecutor(1).submit(
        httpx.post, f"{srv.url}/generate", timeout=60,
        json={"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}})
    time.sleep(1)
    children = [int(p) for p in os.popen(f"pgrep -f -P {srv.proc.pid} spawn_main").read().split()]
    assert children, "the scheduler runs in its own process"
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    assert pending.result().status_code == 503
    code = srv.proc.wait(30)
    assert code != 0
    assert "Traceback" not in srv.stderr()
