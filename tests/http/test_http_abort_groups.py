"""OpenAI n > 1 against the real server: the choices run together, an abort of the response id
covers every member (admitted or not), and a finished group's id still answers 409."""
from __future__ import annotations

import json

import httpx

MAX_TOKENS = 600  # an abort lands long before a quarter of this, even on a loaded machine


def model_name(server) -> str:
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


def data_events(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_abort_of_a_streaming_n3_response_id_aborts_every_choice_with_far_fewer_tokens(server):
    body = {"model": model_name(server), "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "n": 3,
            "temperature": 0.8, "seed": 7, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        first = next(json.loads(line[6:]) for line in lines if line.startswith("data: {"))
        rid = first["id"]
        ack = httpx.post(f"{server.url}/abort_request", json={"rid": rid}, timeout=30)
        rest = data_events(lines)
    assert ack.status_code == 200, ack.text
    answer = ack.json()
    assert answer["status"] == "aborted"
    # Every member was live when the abort arrived: none of them is reported unknown.
    assert sorted(c["rid"] for c in answer["choices"]) == [f"{rid}-{i}" for i in range(3)]
    assert all(c["status"] == "aborted" for c in answer["choices"]), answer
    # Interleaved stream: each chunk names its choice, and each choice's last word is `abort`.
    last: dict[int, str | None] = {}
    for event in [first, *rest]:
        for choice in event["choices"]:
            last[choice["index"]] = choice["finish_reason"]
    assert set(last) <= {0, 1, 2}
    assert all(reason in ("abort", None) for reason in last.values()), last
    for i in range(3):
        view = httpx.get(f"{server.url}/requests/{rid}-{i}").json()
        assert view["status"] == "aborted" and view["finish_reason"]["type"] == "abort", view
        assert view["completion_tokens"] < MAX_TOKENS // 4, view


def test_choices_of_a_streaming_n2_response_interleave_and_all_finish(server):
    body = {"model": model_name(server), "prompt": "Hello", "max_tokens": 12, "n": 2, "temperature": 0.8,
            "seed": 3, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
        lines = list(r.iter_lines())
    events = data_events(lines)
    assert "data: [DONE]" in lines
    indexes = [c["index"] for e in events for c in e["choices"]]
    # Both choices stream together: choice 1 shows up before choice 0 has finished.
    finish_of_0 = next(k for k, e in enumerate(events) if any(c["index"] == 0 and c["finish_reason"]
                                                                for c in e["choices"]))
    assert 1 in [c["index"] for e in events[:finish_of_0] for c in e["choices"]], indexes
    reasons = {c["index"]: c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]}
    assert reasons == {0: "length", 1: "length"}
    assert events[-1]["usage"]["completion_tokens"] == 24


def test_abort_of_a_finished_n2_response_id_answers_409(server):
    name = model_name(server)
    for stream in (False, True):
        body = {"model": name, "prompt": "Hello", "max_tokens": 4, "n": 2, "temperature": 0.8, "seed": 1,
                "stream": stream}
        if stream:
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
                rid = data_events(r.iter_lines())[0]["id"]
        else:
            rid = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["id"]
        late = httpx.post(f"{server.url}/abort_request", json={"rid": rid}, timeout=30)
        assert late.status_code == 409, late.text
        assert late.json()["error"]["param"] == "rid"
