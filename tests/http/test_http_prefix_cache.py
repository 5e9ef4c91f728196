"""The prefix cache and mixed batches through the real server: cached tokens reported where
clients and operators look, and abort exactness under an abort storm with both on."""
from __future__ import annotations

import concurrent.futures
import json
import random
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess

SYSTEM = [(7 * i) % 480 + 3 for i in range(200)]  # a shared 200-token "system prompt"


@pytest.fixture(scope="module", params=[("--enable-mixed-chunk",), ()], ids=["mixed", "default"])
def mixed_server(request, tiny_checkpoint, tmp_path_factory):
    """The prefix cache is on in both: once with mixed batches, once with the default batches."""
    proc = ServerProcess(tiny_checkpoint("llama"), tmp_path_factory.mktemp("cache") / "log", *request.param)
    proc.wait_healthy()
    yield proc
    assert proc.terminate() == 0, proc.stderr()


def _metrics(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def _wait_drained(server: ServerProcess) -> dict[str, float]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = _metrics(server)
        if m["tokenledger_requests_running"] == 0 and m["tokenledger_kv_used_tokens"] == 0:
            return m
        time.sleep(0.1)
    raise AssertionError(f"not drained: {m}")


def test_cached_tokens_in_meta_info_openai_usage_and_metrics(mixed_server):
    url = mixed_server.url
    first = httpx.post(f"{url}/generate", json={"input_ids": SYSTEM + [1, 2], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}}, timeout=60).json()
    assert first["meta_info"]["cached_tokens"] == 0
    again = httpx.post(f"{url}/generate", json={"input_ids": SYSTEM + [3, 4], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}}, timeout=60).json()
    assert again["meta_info"]["cached_tokens"] == len(SYSTEM)
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    done = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": SYSTEM + [5, 6], "max_tokens": 3},
                      timeout=60).json()
    assert done["usage"]["prompt_tokens_details"] == {"cached_tokens": len(SYSTEM)}
    m = _wait_drained(mixed_server)
    assert m["tokenledger_kv_cached_tokens"] >= len(SYSTEM) + 2
    assert m["tokenledger_prefix_cache_hit_tokens_total"] >= 2 * len(SYSTEM)
    assert m["tokenledger_prefix_cache_query_tokens_total"] >= 3 * (len(SYSTEM) + 2)


def _max_new(abort_after: int | None) -> int:
    """A request to abort asks for far more tokens than the abort waits for: on a loaded machine the
    24 client threads read their streams late, and with 200 an abort meant for token 20 could land
    after the request had finished."""
    return 200 if abort_after is None else 1500


def _stream_and_maybe_abort(url: str, i: int, abort_after: int | None) -> tuple[int, dict | None, dict]:
    """Streams one request; aborts it after `abort_after` tokens. Returns the tokens the client
    was shown, the abort's answer, and the final chunk."""
    rid = f"storm-{i}"
    body = {"input_ids": SYSTEM[: 50 + 5 * i] + [i + 1], "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": _max_new(abort_after), "ignore_eos": True, "temperature": 0.8,
                                "seed": i}}
    answer, final = None, {}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            final = json.loads(line[6:])
            if abort_after is not None and answer is None and len(final["output_ids"]) >= abort_after:
                answer = httpx.post(f"{url}/abort_request", json={"rid": rid}, timeout=30).json()
    return len(final["output_ids"]), answer, final


def test_abort_storm_with_mixed_chunk_and_the_cache_is_exact_and_the_log_verifies(mixed_server):
    rng = random.Random(4)
    plan = [(i, rng.choice([None, 0, 1, 3, 8, 20])) for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        results = list(pool.map(lambda p: _stream_and_maybe_abort(mixed_server.url, *p), plan))
    aborted = 0
    for (i, abort_after), (shown, answer, final) in zip(plan, results):
        finish = final["meta_info"]["finish_reason"]["type"]
        if answer is not None and answer.get("status") == "aborted":  # else 409: it had finished first
            aborted += 1
            assert finish == "abort" and shown == answer["completion_tokens"] == final["meta_info"]["completion_tokens"]
        else:
            assert finish == "length" and shown == _max_new(abort_after), (i, abort_after, answer, finish, shown)
    assert aborted >= 10
    _wait_drained(mixed_server)
    ran = subprocess.run([sys.executable, "-m", "ops.cli", "verify", "--log-dir", str(mixed_server.log_dir)],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr  # chain, I2, I6, I7 and the cached-prefix checks
