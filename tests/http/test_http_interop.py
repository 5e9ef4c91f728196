"""Third-party clients' shapes against the real server (issue 15, items 4, 5, 6, 8): SGLang's
bench_serving native body, an agent's chat history, the routes and headers clients expect, and
/metrics as prometheus_client parses it."""
from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

# The body `python -m sglang.bench_serving --backend sglang` sends (its async_request_sglang_generate).
BENCH_SERVING_BODY = {
    "text": "Once upon a time", "sampling_params": {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True},
    "stream": True, "lora_path": None, "return_logprob": False, "return_routed_experts": False,
    "logprob_start_len": -1,
}
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
AGENT_HISTORY = [
    {"role": "developer", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    # As the openai SDK's own message object dumps, appended by an agent loop: the null fields included.
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL], "refusal": None, "function_call": None,
     "audio": None, "annotations": None},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"},
    {"role": "user", "content": [{"type": "text", "text": "And in "}, {"type": "text", "text": "Rome?"}]},
]


def sse_events(response: httpx.Response) -> list:
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in response.iter_lines() if line.startswith("data: ")]


def model_name(server) -> str:
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


def test_bench_serving_native_body_streams_cumulative_chunks_with_latency_and_request_id(server):
    with httpx.stream("POST", f"{server.url}/generate", json=BENCH_SERVING_BODY, timeout=60) as r:
        assert r.status_code == 200, r.read()
        rid = r.headers["x-request-id"]
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[-1]["meta_info"]["completion_tokens"] == 6 and chunks[-1]["text"]
    assert all(c["meta_info"]["id"] == rid for c in chunks)
    latencies = [c["meta_info"]["e2e_latency"] for c in chunks]
    assert latencies[0] > 0 and latencies == sorted(latencies)  # filled on every chunk, growing
    plain = httpx.post(f"{server.url}/generate", json=BENCH_SERVING_BODY | {"stream": False}, timeout=60)
    assert plain.status_code == 200 and plain.json()["text"] == chunks[-1]["text"]
    assert plain.headers["x-request-id"] == plain.json()["meta_info"]["id"]


def test_bench_serving_sampling_params_at_neutral_values_pass_and_unsupported_ones_name_themselves(server):
    neutral = BENCH_SERVING_BODY["sampling_params"] | {"n": 1, "min_new_tokens": 0, "frequency_penalty": 0.0,
                                                       "repetition_penalty": 1.0}
    ok = httpx.post(f"{server.url}/generate", json=BENCH_SERVING_BODY | {"stream": False, "sampling_params": neutral},
                    timeout=60)
    assert ok.status_code == 200, ok.text
    body = BENCH_SERVING_BODY | {"sampling_params": neutral | {"n": 2}}  # n on /generate: send a batch instead
    r = httpx.post(f"{server.url}/generate", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    implemented = neutral | {"frequency_penalty": 0.5, "min_new_tokens": 2}
    r = httpx.post(f"{server.url}/generate", json=BENCH_SERVING_BODY | {"stream": False, "sampling_params": implemented},
                   timeout=60)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] >= 2, r.text
    r = httpx.post(f"{server.url}/generate", json=BENCH_SERVING_BODY | {"lora_path": "my-adapter"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"


def test_agent_history_is_rendered_by_the_tokenizer_chat_template(server):
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    done = client.chat.completions.create(model=model_name(server), messages=AGENT_HISTORY, max_tokens=3,
                                          temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert done.choices[0].finish_reason == "length"
    # The same history through the checkpoint's own template (developer is its system role) gives
    # exactly the prompt the server counted.
    tok = AutoTokenizer.from_pretrained(str(server.model_dir))
    local = [{**m, "role": "system"} if m["role"] == "developer" else m for m in AGENT_HISTORY[:4]]
    local[2] = {k: v for k, v in local[2].items() if k in ("role", "content", "tool_calls")}
    local.append({"role": "user", "content": "And in Rome?"})
    text = tok.apply_chat_template(local, tokenize=False, add_generation_prompt=True)
    assert "<tool_call>get_weather" in text and "<|im_start|>tool\n" in text
    assert done.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize(("change", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),  # no tool_call_id
    ({"messages": [{"role": "user", "content": None}]}, "messages"),  # null content only with tool_calls
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
    ({"messages": [{"role": "assistant", "content": "x", "audio": {"id": "a1"}}]}, "messages"),
])
def test_chat_shapes_still_refused_name_their_field(server, change, param):
    body = {"model": model_name(server), "messages": AGENT_HISTORY, "max_tokens": 2} | change
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_models_retrieve_and_every_404_405_use_the_openai_error_body(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    name = model_name(server)
    assert client.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    for method, path, status in (("GET", "/v1/models/no-such-model", 404), ("GET", "/no/such/route", 404),
                                 ("GET", "/generate", 405), ("DELETE", "/v1/models", 405)):
        r = httpx.request(method, f"{server.url}{path}", timeout=10)
        assert r.status_code == status, (path, r.text)
        body = r.json()
        assert "detail" not in body and body["error"]["code"] == status and body["error"]["message"], body


def test_flush_cache_flushes_when_idle_and_answers_409_while_a_request_runs(server):
    assert httpx.post(f"{server.url}/flush_cache", timeout=10).json()["flushed"] is True
    assert httpx.get(f"{server.url}/flush_cache", timeout=10).status_code == 200  # SGLang serves GET too
    body = {"input_ids": list(range(5, 15)), "rid": "busy-during-flush", "stream": True,
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
    with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        busy = httpx.post(f"{server.url}/flush_cache", timeout=10)
        assert busy.status_code == 409, busy.text
        assert busy.json()["error"]["live_requests"] >= 1
        # With ?timeout the front keeps asking: the abort below lets it succeed.
        waited: dict[str, httpx.Response] = {}
        flusher = threading.Thread(target=lambda: waited.setdefault(
            "r", httpx.post(f"{server.url}/flush_cache?timeout=30", timeout=40)))
        flusher.start()
        httpx.post(f"{server.url}/abort_request", json={"rid": "busy-during-flush"}, timeout=30)
        flusher.join(45)
    assert waited["r"].status_code == 200, waited["r"].text
    assert httpx.post(f"{server.url}/flush_cache?timeout=abc", timeout=10).json()["error"]["param"] == "timeout"


def test_batch_streaming_on_generate_names_each_prompt_by_index(server):
    body = {"text": ["Once upon a time", "The cat"], "sampling_params": [
        {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True},
        {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True}]}
    plain = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    with httpx.stream("POST", f"{server.url}/generate", json=body | {"stream": True}, timeout=60) as r:
        rids = r.headers["x-request-id"].split(",")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    last = {c["index"]: c for c in events[:-1]}  # the last chunk of each prompt
    assert sorted(last) == [0, 1] and [last[i]["meta_info"]["id"] for i in (0, 1)] == rids
    for i in (0, 1):
        assert last[i]["output_ids"] == plain[i]["output_ids"] and last[i]["text"] == plain[i]["text"]


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(server):
    body = {"model": model_name(server), "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.headers["x-request-id"].startswith("cmpl-")
        events = sse_events(r)[:-1]
    assert all(e["id"] == r.headers["x-request-id"] for e in events)
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 5 and counts[0] < 5
    assert all(e["usage"]["prompt_tokens"] == events[-1]["usage"]["prompt_tokens"] > 0 for e in events)
    bad = httpx.post(f"{server.url}/v1/completions", json=body | {"stream_options": {"bogus": True}}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream_options"


def test_logprob_meta_info_has_sglang_length_and_top_logprobs_only_when_asked(server):
    body = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
            "return_logprob": True}
    meta = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()["meta_info"]
    assert meta["output_token_logprobs_length"] == len(meta["output_token_logprobs"]) == 4
    assert "output_top_logprobs" not in meta
    meta = httpx.post(f"{server.url}/generate", json=body | {"top_logprobs_num": 2}, timeout=60).json()["meta_info"]
    assert [len(top) for top in meta["output_top_logprobs"]] == [2, 2, 2, 2]
    with httpx.stream("POST", f"{server.url}/generate", json=body | {"stream": True}, timeout=60) as r:
        chunks = sse_events(r)[:-1]
    assert [c["meta_info"]["output_token_logprobs_length"] for c in chunks][-1] == 4


def test_metrics_parse_with_prometheus_client_and_count_requests_by_model_and_reason(server):
    name = model_name(server)
    httpx.post(f"{server.url}/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 3,
                                                                                     "ignore_eos": True}}, timeout=60)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)}
    samples = {(s.name, json.dumps(s.labels, sort_keys=True)): s.value for f in families.values() for s in f.samples}
    assert all(json.loads(labels).get("model_name") == name for _, labels in samples)
    def total(metric: str, **labels: str) -> float:
        return sum(v for (n, lab), v in samples.items() if n == metric and labels.items() <= json.loads(lab).items())

    assert total("tokenledger_requests_finished_total", reason="length") >= 1
    for histogram in ("tokenledger_time_to_first_token_seconds", "tokenledger_inter_token_latency_seconds",
                      "tokenledger_e2e_request_latency_seconds", "tokenledger_request_prompt_tokens",
                      "tokenledger_request_generation_tokens"):
        assert total(f"{histogram}_count") >= 1, histogram


def test_openai_routes_take_sglang_extras_rid_regex_and_stop_token_ids(server):
    name = model_name(server)
    body = {"model": name, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "rid": "client-cmpl-1",
            "regex": "[a-z]{3}"}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == r.headers["x-request-id"] == "client-cmpl-1"
    assert len(out["choices"][0]["text"]) == 3 and out["choices"][0]["text"].isalpha()
    assert httpx.get(f"{server.url}/requests/client-cmpl-1").json()["rid"] == "client-cmpl-1"
    greedy = httpx.post(f"{server.url}/generate", json={"text": "Once upon a time", "sampling_params": {
        "temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}, timeout=60).json()["output_ids"]
    stop_at = greedy[2]
    cut = httpx.post(f"{server.url}/v1/completions",
                     json={"model": name, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                           "stop_token_ids": [stop_at]}, timeout=60).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] == greedy.index(stop_at) + 1
    bad = httpx.post(f"{server.url}/v1/completions", json=body | {"rid": "r" * 300}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rid"
