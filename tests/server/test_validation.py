"""Bad input is refused with a typed error naming the field, before any forward."""
from __future__ import annotations

import json

import pytest

from server.config import ServerArgs
from server.errors import ConfigError, InvalidRequestError, ModelLoadError
from server.models.config import ModelConfig


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    from server import Engine

    e = Engine(model_path=str(tiny_checkpoint("llama")), max_total_tokens=1000, context_length=512)
    yield e
    e.shutdown()
    assert e.scheduler.kv_live_tokens == 0
    e.scheduler.check_integrity()


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1], "sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"input_ids": [1], "sampling_params": {"top_k": -2}}, "top_k"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": "3"}}, "max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 600}}, "max_new_tokens"),
        ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "bogus"),
        ({"input_ids": [1], "sampling_params": {"json_schema": "{\"type\": \"nope\"}"}}, "json_schema"),
        ({"input_ids": [1], "sampling_params": {"regex": "(ab"}}, "regex"),
        ({"input_ids": [1], "sampling_params": {"regex": "a", "ebnf": "root ::= \"a\""}}, "ebnf"),
        ({"input_ids": [1], "sampling_params": {"stop": [""]}}, "stop"),
        ({"input_ids": [10**6]}, "input_ids"),
        ({"input_ids": [1, "x"]}, "input_ids"),
        ({"input_ids": []}, "text"),
        ({}, "text"),
        ({"prompt": "a", "input_ids": [1]}, "text"),
        ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len"),
        ({"input_ids": [1], "top_logprobs_num": -1}, "top_logprobs_num"),
        ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "sampling_params"),
        ({"input_ids": [[1], [2]], "rid": ["a", "a"]}, "rid"),
        ({"input_ids": [1], "rid": "r" * 257}, "rid"),
        ({"input_ids": [1], "rid": "bad\ud800rid"}, "rid"),
        ({"input_ids": [[1], [2]], "rid": ["ok", "r" * 257]}, "rid"),
    ],
)
def test_bad_generate_arguments_raise_invalid_request_naming_the_field(engine, kwargs, param):
    with pytest.raises(InvalidRequestError) as info:
        engine.generate(**kwargs)
    assert info.value.param == param
    assert engine.scheduler.is_idle


def test_unknown_architecture_fails_at_start_naming_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dir(tmp_path)
    for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"):
        assert name in str(info.value)


def test_unknown_or_invalid_server_arguments_are_refused():
    with pytest.raises(ConfigError, match="chunk_size"):
        ServerArgs.from_kwargs(chunk_size=3)
    with pytest.raises(ConfigError, match="log-durability"):
        ServerArgs.from_kwargs(log_durability="sometimes")
    for flag in ("num_threads", "prefill_threads"):
        with pytest.raises(ConfigError, match=f"--{flag.replace('_', '-')} must be >= 1"):
            ServerArgs.from_kwargs(**{flag: 0})
    with pytest.raises(ConfigError, match="--small-decode-rows must be >= 0"):
        ServerArgs.from_kwargs(small_decode_rows=-1)
    args = ServerArgs.from_kwargs(log_dir="/tmp/x", disable_overlap_schedule=True)
    assert args.log_dir == "/tmp/x" and args.disable_overlap_schedule
