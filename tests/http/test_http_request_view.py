"""`GET /requests/{rid}` and the abort API on the edges of the log's view (issue 10 A.4): a rid
holding "/" reads back, and a request whose records are corrupt is reported as corrupt, with
the salvage command, by both routes (never a bare 500 or "unknown")."""
from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import lmdb
import pytest
from server_process import ServerProcess

GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    proc = ServerProcess(tiny_checkpoint("llama"), tmp_path_factory.mktemp("view") / "log")
    proc.wait_healthy()
    yield proc
    assert proc.terminate() == 0, proc.stderr()


def generate(server, rid: str) -> dict:
    r = httpx.post(f"{server.url}/generate", json={"input_ids": [5, 6, 7], "rid": rid, "sampling_params": GREEDY},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("path", ["tenant-7/batch/2", quote("tenant-7/batch/2", safe="")])
def test_a4_a_rid_holding_a_slash_reads_back_at_get_requests(server, path):
    if not httpx.get(f"{server.url}/requests/{quote('tenant-7/batch/2', safe='')}").is_success:
        generate(server, "tenant-7/batch/2")
    r = httpx.get(f"{server.url}/requests/{path}")
    assert r.status_code == 200, r.text
    assert r.json()["rid"] == "tenant-7/batch/2" and r.json()["completion_tokens"] == 4


def corrupt_a_commit_of(log_dir: Path, rid: str) -> None:
    """Flips the last byte of one of `rid`'s records after its BEGIN, under the running server (disk rot)."""
    env = lmdb.open(str(log_dir), max_dbs=8, map_size=1 << 30, readahead=False)
    try:
        records = env.open_db(b"records", create=False)
        with env.begin(write=True, db=records) as txn:
            mine = [(bytes(k), bytes(v)) for k, v in txn.cursor() if rid.encode() in bytes(v)]
            key, value = mine[1]  # mine[0] is the BEGIN: damage a later record
            txn.put(key, value[:-1] + bytes([value[-1] ^ 0xFF]))
    finally:
        env.close()


def test_a4_a_corrupt_record_is_reported_as_corrupt_with_the_salvage_command(server):
    generate(server, "rotten")
    assert httpx.get(f"{server.url}/requests/rotten").status_code == 200
    corrupt_a_commit_of(server.log_dir, "rotten")

    view = httpx.get(f"{server.url}/requests/rotten")
    abort = httpx.post(f"{server.url}/abort_request", json={"rid": "rotten"})
    for r in (view, abort):
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["type"] == "corrupt_log" and error["param"] == "rid"
        assert "corrupt" in error["message"] and f"tokenledger salvage --log-dir {server.log_dir}" in error["message"]
    # The server goes on serving other requests.
    assert generate(server, "after-the-rot")["meta_info"]["completion_tokens"] == 4
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_a4_get_requests_reads_the_log_off_the_event_loop(monkeypatch):
    # A long request's records take a while to decode; /health must answer meanwhile.
    import threading
    import time
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from server.http import app as app_module

    def slow_read(_front: object, rid: str) -> dict:
        time.sleep(1.5)  # stands in for decoding thousands of records, holding its thread
        return {"rid": rid}

    monkeypatch.setattr(app_module, "_read_audit", slow_read)
    front = SimpleNamespace(args=SimpleNamespace(api_key=None, admin_api_key=None), is_serving=True,
                            client=SimpleNamespace(abort_durable_times={}))
    answers: list[httpx.Response] = []
    with TestClient(app_module.create_app(front)) as client:  # type: ignore[arg-type]  # one event loop for both
        reader = threading.Thread(target=lambda: answers.append(client.get("/requests/long-one")))
        reader.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        assert client.get("/health").status_code == 200
        health_s = time.monotonic() - t0
        reader.join()
    assert answers[0].json() == {"rid": "long-one"}
    assert health_s < 0.8, f"/health waited {health_s:.2f}s behind a log read"


def test_an_aborted_request_reports_when_its_abort_became_durable_and_others_do_not(server):
    """A disconnect's abort latency is the server's durable time minus the client's close (one
    machine clock): `abort_durable_time` lies between the two, for a disconnect and an API abort."""
    body = {"input_ids": [5, 6, 7], "rid": "gone-away", "stream": True,
            "sampling_params": {**GREEDY, "max_new_tokens": 600}}
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{server.url}/generate", json=body) as r:
        next(line for line in r.iter_lines() if line.startswith("data: {"))
        closed = time.time()
    view = wait_for_abort_time(server, "gone-away")
    assert view["finish_reason"]["type"] == "abort" and closed <= view["abort_durable_time"] <= time.time()

    body["rid"] = "api-aborted"
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{server.url}/generate", json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        called = time.time()
        assert client.post(f"{server.url}/abort_request", json={"rid": "api-aborted"}).status_code == 200
        last = [json.loads(line[6:]) for line in lines if line.startswith("data: {")][-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert called <= wait_for_abort_time(server, "api-aborted")["abort_durable_time"] <= time.time()

    generate(server, "ran-to-its-end")
    assert "abort_durable_time" not in httpx.get(f"{server.url}/requests/ran-to-its-end").json()


def wait_for_abort_time(server, rid: str, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = httpx.get(f"{server.url}/requests/{rid}").json()
        if "abort_durable_time" in view:
            return view
        time.sleep(0.05)
    raise AssertionError(f"{rid}: no abort_durable_time after {timeout_s} s: {view}")
