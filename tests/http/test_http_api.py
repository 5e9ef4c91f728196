"""End to end against the real server process: native and OpenAI routes, streams, aborts,
disconnects, concurrency, bad input and metrics."""
from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def sse_events(response: httpx.Response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def model_name(server) -> str:
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


def test_generate_stream_and_non_stream_agree(server):
    body = {"input_ids": list(range(5, 25)), "sampling_params": GREEDY, "return_logprob": True}
    plain = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    with httpx.stream("POST", f"{server.url}/generate", json=body | {"stream": True}, timeout=60) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["output_ids"] == plain["output_ids"] and last["text"] == plain["text"]
    assert len(plain["output_ids"]) == 12 and plain["meta_info"]["finish_reason"]["type"] == "length"
    assert [lp for lp, _, _ in last["meta_info"]["output_token_logprobs"]] == pytest.approx(
        [lp for lp, _, _ in plain["meta_info"]["output_token_logprobs"]], abs=1e-5)
    # Cumulative chunks: each one extends the previous.
    ids = [e["output_ids"] for e in events[:-1]]
    assert all(b[: len(a)] == a for a, b in zip(ids, ids[1:]))


def test_openai_completions_and_chat_with_the_openai_package(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    name = model_name(server)
    done = client.completions.create(model=name, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=2)
    streamed = client.completions.create(model=name, prompt="Once upon a time", max_tokens=8, temperature=0,
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    assert chunks[-1].usage.completion_tokens == done.usage.completion_tokens == 8
    assert all(c.id == done.id or c.id.startswith("cmpl-") for c in chunks)
    assert len(done.choices[0].logprobs.token_logprobs) == 8
    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                          temperature=0, logprobs=True, top_logprobs=2)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 6
    assert len(chat.choices[0].logprobs.content) == 6
    two = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                         n=2, temperature=0.9, seed=3)
    assert len(two.choices) == 2
    # The response id is the rid the log knows.
    view = httpx.get(f"{server.url}/requests/{done.id}").json()
    assert view["rid"] == done.id and view["completion_tokens"] == 8


def _aborts_timed(url: str) -> float:
    """How many aborts `/metrics` has timed (`tokenledger_abort_seconds`: one per live request aborted)."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if family.name == "tokenledger_abort_seconds":
            return next(s.value for s in family.samples if s.name.endswith("_count"))
    raise AssertionError("no tokenledger_abort_seconds in /metrics")


def test_a_token_whose_text_is_held_back_still_gets_its_chunk(server):
    """A client times the first token by the first chunk (as `vllm bench serve` does). A token whose
    text is held back, here because it could begin a stop string, must still get a chunk, with
    empty text; the text itself comes once it is certain, and the whole text is unchanged."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    name = model_name(server)
    plain = client.completions.create(model=name, prompt="Once upon a time", max_tokens=4, temperature=0)
    first = client.completions.create(model=name, prompt="Once upon a time", max_tokens=1, temperature=0).choices[0].text
    assert first, "the first token decodes to no text: pick another prompt"
    stop = first + "\u2603never"  # the first token's text is a prefix of this stop string: held back
    streamed = list(client.completions.create(model=name, prompt="Once upon a time", max_tokens=4, temperature=0,
                                              stop=[stop], stream=True))
    texts = [c.choices[0].text for c in streamed if c.choices]
    assert len(texts) == 4, texts  # one chunk per token, the held-back one included
    assert texts[0] == "" and "".join(texts) == plain.choices[0].text


def test_abort_mid_stream_ends_with_exactly_the_acknowledged_tokens(server):
    body = {"input_ids": list(range(5, 15)), "rid": "abort-me", "stream": True,
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True, "temperature": 0}}
    timed_before = _aborts_timed(server.url)
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=120) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: ") and len(json.loads(line[6:])["output_ids"]) >= 3:
                break
        ack = httpx.post(f"{server.url}/abort_request", json={"rid": "abort-me"}, timeout=30)
        rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert ack.status_code == 200, ack.text
    answer = ack.json()
    assert answer["status"] == "aborted" and answer["lsn"] > 0
    final = rest[-1]
    assert final["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(final["output_ids"]) == answer["completion_tokens"] == final["meta_info"]["completion_tokens"]
    assert httpx.post(f"{server.url}/abort_request", json={"rid": "abort-me"}).status_code == 409
    assert httpx.post(f"{server.url}/abort_request", json={"rid": "never-was"}).status_code == 404
    assert _aborts_timed(server.url) == timed_before + 1  # the live one; the late and the unknown are not timed


def test_client_rid_that_collides_with_a_live_request_gets_409(server):
    body = {"input_ids": [9, 10, 11], "rid": "taken", "stream": True,
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()  # kept open: dropping the iterator would close the connection
        next(line for line in lines if line.startswith("data: "))
        for stream in (False, True):
            clash = httpx.post(f"{server.url}/generate", json=body | {"stream": stream}, timeout=30)
            assert clash.status_code == 409 and clash.json()["error"]["param"] == "rid"
        assert httpx.post(f"{server.url}/abort_request", json={"rid": "taken"}).json()["status"] == "aborted"


def test_client_disconnect_aborts_with_source_disconnect(server):
    body = {"input_ids": list(range(7, 17)), "rid": "walk-away", "stream": True,
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        view = httpx.get(f"{server.url}/requests/walk-away").json()
        if view.get("status") == "aborted":
            break
        time.sleep(0.2)
    assert view["status"] == "aborted" and view["abort_source"] == "disconnect"
    assert view["finish_reason"]["type"] == "abort"


def wait_for_abort(server, rid: str, timeout: float = 30) -> dict:
    deadline, view = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        view = httpx.get(f"{server.url}/requests/{rid}").json()
        if view.get("status") == "aborted":
            break
        time.sleep(0.2)
    return view


def test_a6_non_streaming_client_that_disconnects_is_aborted_with_source_disconnect(server):
    # The client gives up after 1 s; 1,500 tokens take several. Before the fix the auth middleware
    # (BaseHTTPMiddleware) hid the disconnect and the request ran to its limit.
    body = {"input_ids": list(range(9, 19)), "rid": "walk-away-json",
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/generate", json=body, timeout=httpx.Timeout(30, read=1.0))
    view = wait_for_abort(server, "walk-away-json")
    assert view["status"] == "aborted" and view["abort_source"] == "disconnect", view
    assert view["completion_tokens"] < 1500


def test_64_concurrent_streams_all_complete(server):
    def one(i: int) -> int:
        body = {"input_ids": list(range(3 + i, 13 + i)), "stream": True,
                "sampling_params": {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0.7, "seed": i}}
        with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=300) as r:
            events = sse_events(r)
        assert events[-1] == "[DONE]"
        return len(events[-2]["output_ids"])

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        assert list(pool.map(one, range(64))) == [6] * 64


@pytest.mark.parametrize(
    ("route", "body", "status", "param"),
    [
        ("/generate", "{not json", 400, None),
        ("/generate", [1, 2], 400, None),
        ("/generate", {"text": "a", "input_ids": [1]}, 400, "text"),
        ("/generate", {}, 400, "text"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, 400, "max_new_tokens"),
        ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 10**9}}, 400, "max_new_tokens"),
        ("/generate", {"text": "a", "sampling_params": {"temperature": -0.5}}, 400, "temperature"),
        ("/generate", {"text": "a", "sampling_params": {"top_p": 0}}, 400, "top_p"),
        ("/generate", {"text": "a", "sampling_params": {"top_k": -3}}, 400, "top_k"),
        ("/generate", {"input_ids": [10**7]}, 400, "input_ids"),
        ("/generate", {"input_ids": [5] * 2040, "sampling_params": {"max_new_tokens": 100}}, 400, "max_new_tokens"),
        ("/generate", {"text": "a", "sampling_params": {"regex": "("}}, 400, "regex"),
        ("/generate", {"text": "a", "bogus": 1}, 400, "bogus"),
        ("/generate", {"text": "a", "return_logprob": "yes"}, 400, "return_logprob"),
        ("/generate", {"text": "a", "rid": "r" * 257}, 400, "rid"),
        ("/generate", '{"text": "a", "rid": "bad\\ud800rid"}', 400, "rid"),
        ("/v1/completions", {"prompt": "a"}, 400, "model"),
        ("/v1/completions", {"model": "nope", "prompt": "a"}, 400, "model"),
        ("/v1/completions", {"model": "@", "prompt": "a", "logit_bias": {"1": 500}}, 400, "logit_bias"),
        ("/v1/completions", {"model": "@", "prompt": "a", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
        ("/v1/chat/completions", {"model": "@", "messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"model": "@", "messages": [{"role": "user", "content": "a"}],
                                  "response_format": {"type": "json_schema"}}, 400, "response_format"),
    ],
)
def test_bad_input_gets_a_clear_4xx_and_the_server_stays_healthy(server, route, body, status, param):
    if isinstance(body, dict) and body.get("model") == "@":
        body = body | {"model": model_name(server)}
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(f"{server.url}{route}", content=content, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] and error["code"] == status
    if param is not None:
        assert error["param"] == param
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_oversized_body_is_413(server):
    r = httpx.post(f"{server.url}/generate", content=b"x" * (9 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert httpx.get(f"{server.url}/health").status_code == 200


def _metric_values(server) -> dict[str, float]:
    """Sample name (with its labels other than model_name) -> value, as prometheus_client parses /metrics."""
    text = httpx.get(f"{server.url}/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name")
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_metrics_show_kv_used_back_to_zero_after_a_drain(server):
    httpx.post(f"{server.url}/generate", json={"input_ids": [5, 6, 7], "sampling_params": GREEDY}, timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        values = _metric_values(server)
        if values["tokenledger_kv_used_tokens"] == 0 and values["tokenledger_requests_running"] == 0:
            break
        time.sleep(0.1)
    assert values["tokenledger_kv_used_tokens"] == 0
    assert values["tokenledger_kv_total_tokens"] == 16384
    for name in ("tokenledger_generated_tokens_total", "tokenledger_wal_durable_lsn", "tokenledger_step_seconds_count",
                 "tokenledger_time_to_first_token_seconds_count", "tokenledger_wal_group_commit_seconds_count",
                 'tokenledger_aborts_total{source="api"}', "tokenledger_discarded_results_total"):
        assert name in values, name


def test_one_json_log_line_per_request_at_finish_with_text_at_level_3(server):
    out = httpx.post(f"{server.url}/generate", json={"text": "Once upon", "rid": "logged", "sampling_params": GREEDY},
                     timeout=60).json()
    deadline = time.monotonic() + 10
    lines: list[dict] = []
    while time.monotonic() < deadline and not lines:
        lines = [json.loads(line) for line in server.stderr().splitlines()
                 if line.startswith("{") and '"rid": "logged"' in line]
        time.sleep(0.1)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line["event"] == "request_finished" and line["completion_tokens"] == 12
    assert line["prompt"] == "Once upon" and line["output"] == out["text"]
    assert line["sampling_params"]["max_new_tokens"] == 12 and line["finish_reason"] == "length"
