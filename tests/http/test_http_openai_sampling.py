"""The sampling controls on the OpenAI routes do what the same controls do on /generate, and a bad
value is a 400 naming the field as the client spelled it."""
from __future__ import annotations

import json
import re

import httpx
import pytest
from server_process import ServerProcess

PROMPT = [17, 230, 41, 99, 7, 301]
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    proc = ServerProcess(tiny_checkpoint("llama"), tmp_path_factory.mktemp("oai-sampling") / "log")
    proc.wait_healthy()
    yield proc
    assert proc.terminate() == 0, proc.stderr()


def _model(server) -> str:
    return str(httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"])


def _complete(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json={"model": _model(server), "prompt": PROMPT, **body},
                      timeout=120)


def _generate(server, **params) -> dict:
    r = httpx.post(f"{server.url}/generate", json={"input_ids": PROMPT, "sampling_params": params}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_completions_penalties_and_bias_equal_generate_with_the_same_controls(server):
    controls = {"frequency_penalty": 1.2, "presence_penalty": 0.5, "repetition_penalty": 1.4,
                "logit_bias": {"300": 3.0, "12": -5}}
    r = _complete(server, max_tokens=10, **GREEDY, **controls)
    assert r.status_code == 200, r.text
    native = _generate(server, max_new_tokens=10, **GREEDY, **controls)
    plain = _generate(server, max_new_tokens=10, **GREEDY)
    assert r.json()["choices"][0]["text"] == native["text"] != plain["text"]


def test_min_tokens_and_stop_token_ids_on_completions(server):
    first = _generate(server, max_new_tokens=1, **GREEDY)["output_ids"][0]
    stopped = _complete(server, max_tokens=8, stop_token_ids=[first], logprobs=0, **GREEDY).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and len(stopped["logprobs"]["tokens"]) == 1
    held = _complete(server, max_tokens=8, stop_token_ids=[first], min_tokens=4, logprobs=0, **GREEDY)
    assert held.status_code == 200, held.text
    assert len(held.json()["choices"][0]["logprobs"]["tokens"]) >= 4


def test_chat_logit_bias_forces_its_token(server):
    forced = 300
    body = {"model": _model(server), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "logit_bias": {str(forced): 100}, "logprobs": True, **GREEDY}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    native = _generate(server, max_new_tokens=1, **GREEDY)  # any prompt: the bias wins every step
    assert native["output_ids"] != [forced]
    tokens = [c["token"] for c in r.json()["choices"][0]["logprobs"]["content"]]
    assert len(tokens) == 3 and len(set(tokens)) == 1


def test_regex_on_completions_constrains_the_text(server):
    r = _complete(server, max_tokens=20, regex="(yes|no)[0-9]{2}", temperature=1.0, seed=3)
    assert r.status_code == 200, r.text
    assert re.fullmatch("(yes|no)[0-9]{2}", r.json()["choices"][0]["text"])


def test_no_stop_trim_keeps_the_matched_stop_string(server):
    text = _complete(server, max_tokens=12, **GREEDY).json()["choices"][0]["text"]
    stop = text[4:6]
    assert stop.strip(), f"need a visible stop string in {text!r}"
    trimmed = _complete(server, max_tokens=12, stop=[stop], **GREEDY).json()["choices"][0]
    kept = _complete(server, max_tokens=12, stop=[stop], no_stop_trim=True, **GREEDY).json()["choices"][0]
    assert trimmed["finish_reason"] == kept["finish_reason"] == "stop"
    assert stop not in trimmed["text"] and kept["text"].startswith(trimmed["text"] + stop)


@pytest.mark.parametrize("field,value,param", [
    ("min_tokens", 9, "min_tokens"), ("frequency_penalty", 3, "frequency_penalty"),
    ("repetition_penalty", -1, "repetition_penalty"), ("logit_bias", {"999999": 1}, "logit_bias"),
    ("logit_bias", {"x": 1}, "logit_bias"), ("stop_token_ids", "5", "stop_token_ids"),
    ("skip_special_tokens", "yes", "skip_special_tokens"), ("regex", "(", "regex"),
])
def test_bad_sampling_control_on_completions_is_a_400_naming_it(server, field, value, param):
    r = _complete(server, max_tokens=4, **{field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_streamed_echo_equals_the_non_streamed_answer(server, max_tokens):
    body = {"model": _model(server), "prompt": "hello world", "max_tokens": max_tokens, "echo": True, "logprobs": 2,
            **GREEDY}
    whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    text, tokens, logprobs = "", [], []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body | {"stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                if choice["logprobs"]:
                    tokens += choice["logprobs"]["tokens"]
                    logprobs += choice["logprobs"]["token_logprobs"]
    assert text == whole["text"] and text.startswith("hello world")
    assert tokens == whole["logprobs"]["tokens"] and logprobs == whole["logprobs"]["token_logprobs"]
    assert logprobs[0] is None and len(tokens) > max_tokens


def test_skip_special_tokens_false_shows_a_special_token_in_the_text(server):
    from server.tokenizer import Tokenizer

    tok = Tokenizer(server.model_dir)
    eos = tok.eos_token_id
    assert eos is not None
    forced = {"max_tokens": 2, "logit_bias": {str(eos): 100}, **GREEDY}  # ignore_eos: the EOS is just a token
    hidden = _complete(server, **forced).json()["choices"][0]["text"]
    shown = _complete(server, skip_special_tokens=False, **forced).json()["choices"][0]["text"]
    assert hidden == "" and shown == tok.token_text(eos) * 2 != ""
