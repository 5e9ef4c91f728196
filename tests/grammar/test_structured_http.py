"""Structured output and reasoning over the real HTTP server: OpenAI response_format
(json_object, json_schema), /generate with regex, 400s naming the field, reasoning_content."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
from server_process import ServerProcess  # noqa: E402

SCHEMA = {"type": "object", "properties": {"pet": {"enum": ["cat", "dog"]}, "age": {"type": "integer", "minimum": 0,
                                                                                   "maximum": 30}},
          "required": ["pet", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    proc = ServerProcess(tiny_checkpoint("llama"), tmp_path_factory.mktemp("grammar-http") / "log",
                         "--reasoning-parser", "qwen3")
    proc.wait_healthy()
    yield proc
    assert proc.terminate() == 0, proc.stderr()


def _chat(server, **extra) -> httpx.Response:
    model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "pet?"}], "max_tokens": 60, **extra}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)


def test_response_format_json_schema_and_json_object(server):
    for seed in range(3):
        r = _chat(server, temperature=1.0, seed=seed,
                  response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}})
        assert r.status_code == 200, r.text
        value = json.loads(r.json()["choices"][0]["message"]["content"])
        assert value["pet"] in ("cat", "dog") and 0 <= value["age"] <= 30 and set(value) == {"pet", "age"}
    r = _chat(server, temperature=0, response_format={"type": "json_object"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_generate_regex_and_reasoning_tokens_in_meta_info(server):
    body = {"text": "code:", "sampling_params": {"regex": r"[A-Z]{2}[0-9]{3}", "temperature": 0.8, "seed": 1,
                                                  "max_new_tokens": 16}}
    out = httpx.post(f"{server.url}/generate", json=body, timeout=120).json()
    assert re.fullmatch(r"[A-Z]{2}[0-9]{3}", out["text"]) and out["meta_info"]["finish_reason"]["type"] == "stop"
    assert out["meta_info"]["reasoning_tokens"] == 0  # qwen3 style: no <think> first, no reasoning


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/generate", {"text": "a", "sampling_params": {"regex": "[a-"}}, "regex"),
    ("/generate", {"text": "a", "sampling_params": {"json_schema": '{"type": "integer", "minimum": "x"}'}},
     "json_schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}},
     "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format"),
])
def test_invalid_constraints_are_400_naming_the_field(server, route, body, param):
    if route.startswith("/v1"):
        r = _chat(server, **body)
    else:
        r = httpx.post(f"{server.url}{route}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_chat_returns_reasoning_content_separately(server):
    r = _chat(server, temperature=0, max_tokens=8)
    message = r.json()["choices"][0]["message"]
    assert "reasoning_content" in message  # None unless the model opened <think>
    stream = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "model": httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"], "stream": True, "max_tokens": 8,
        "temperature": 0, "messages": [{"role": "user", "content": "pet?"}]})
    chunks = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
    assert text == message["content"]
