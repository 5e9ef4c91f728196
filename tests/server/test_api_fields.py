"""The field contract (issue 15, item 1): unknown fields, neutral-only fields and refused fields
each answer a 400 naming the field; neutral values pass; docs/api.md is the contract's own table."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from server.api_fields import (
    AWAITING,
    GENERATE,
    SAMPLING,
    Support,
    awaiting,
    implemented,
    render_tables,
    same_value,
)
from server.errors import InvalidRequestError
from server.http.metrics import render_name_mapping
from server.http.openai_fields import CHAT, COMPLETIONS
from server.sampling.params import SamplingParams

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _block(name: str) -> str:
    match = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", DOCS.read_text(), re.S)
    assert match, f"docs/api.md has no {name} block"
    return match.group(1).strip()


def test_docs_api_md_field_tables_are_the_ones_the_code_enforces():
    assert _block("fields") == render_tables([GENERATE, SAMPLING, COMPLETIONS, CHAT]).strip(), (
        "docs/api.md is stale: run `python -m server.api_fields --write docs/api.md`")


def test_docs_api_md_lists_every_sglang_metric_name():
    assert _block("metric-names") == render_name_mapping().strip()


def test_every_samplingparams_field_is_implemented_in_the_contract():
    # When a field awaiting implementation lands in SamplingParams, its AWAITING entry must go (or
    # the docs would call it neutral-only while it works); a new SamplingParams field must be listed.
    fields = {f.name for f in dataclasses.fields(SamplingParams)}
    assert fields <= SAMPLING.implemented(), "list these in server.api_fields.SAMPLING"
    assert not set(AWAITING) & fields, "drop these from server.api_fields.AWAITING: they are implemented now"


def test_dropping_an_awaiting_entry_makes_the_field_implemented(monkeypatch):
    monkeypatch.setitem(AWAITING, "a_field_in_progress", 0)
    assert awaiting("a_field_in_progress")["a_field_in_progress"].support is Support.NEUTRAL_ONLY
    assert awaiting("a_field_that_landed") == {"a_field_that_landed": implemented()}


@pytest.mark.parametrize(("raw", "name", "value"), [
    ({"frequency_penalty": 0.5}, "frequency_penalty", 0.5),
    ({"presence_penalty": -1}, "presence_penalty", -1.0),
    ({"repetition_penalty": 1.2}, "repetition_penalty", 1.2),
    ({"min_new_tokens": 3}, "min_new_tokens", 3),
    ({"logit_bias": {"5": 1.0}}, "logit_bias", ((5, 1.0),)),
    ({"no_stop_trim": True}, "no_stop_trim", True),
    ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens", False),
    ({"sampling_seed": 7}, "seed", 7),
])
def test_the_sampling_controls_once_awaited_are_implemented(raw, name, value):
    assert getattr(SamplingParams.from_dict(raw), name) == value


@pytest.mark.parametrize(("raw", "param"), [
    ({"bogus": 1}, "bogus"),
    ({"n": 2}, "n"),
    ({"n": True}, "n"),  # JSON true is not the number 1
    ({"structural_tag": "x"}, "structural_tag"),
])
def test_sampling_params_refuses_non_neutral_and_unknown_fields_naming_them(raw, param):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams.from_dict({"max_new_tokens": 4} | raw)
    assert info.value.param == param and param in str(info.value)


def test_sampling_params_accept_bench_clients_neutral_values():
    neutral = {"n": 1, "frequency_penalty": 0.0, "presence_penalty": 0, "repetition_penalty": 1.0,
               "min_new_tokens": 0, "logit_bias": {}, "no_stop_trim": False, "spaces_between_special_tokens": True,
               "stream_interval": 1, "stop_regex": [], "sampling_seed": None, "custom_params": None}
    assert SamplingParams.from_dict({"max_new_tokens": 4, "temperature": 0.0} | neutral) == SamplingParams(
        max_new_tokens=4, temperature=0.0)


@pytest.mark.parametrize(("body", "param"), [
    ({"lora_path": "adapter-a"}, "lora_path"),
    ({"return_routed_experts": True}, "return_routed_experts"),
    ({"return_text_in_logprobs": True}, "return_text_in_logprobs"),
    ({"custom_logit_processor": "x"}, "custom_logit_processor"),
    ({"data_parallel_rank": 1}, "data_parallel_rank"),
    ({"bootstrap_room": 3}, "bootstrap_room"),
    ({"image_data": "a.png"}, "image_data"),
    ({"Text": "a"}, "Text"),
])
def test_generate_body_refuses_non_neutral_documented_fields_naming_them(body, param):
    with pytest.raises(InvalidRequestError) as info:
        GENERATE.check({"text": "a"} | body)
    assert info.value.param == param
    assert "unknown field" in str(info.value) if param == "Text" else "unknown" not in str(info.value)


def test_bench_serving_native_body_passes_the_contract():
    # sglang.bench_serving --backend sglang sends exactly this shape (lora_path null, no routed experts).
    body = {"text": "hi", "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
            "stream": True, "lora_path": None, "return_logprob": False, "return_routed_experts": False,
            "logprob_start_len": -1, "data_parallel_rank": 0, "bootstrap_host": None}
    GENERATE.check(body)
    SamplingParams.from_dict(body["sampling_params"])


@pytest.mark.parametrize(("surface", "body", "param"), [
    (COMPLETIONS, {"best_of": 2}, "best_of"),
    (COMPLETIONS, {"suffix": "tail"}, "suffix"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    (CHAT, {"tool_choice": "auto"}, "tool_choice"),
    (CHAT, {"functions": []}, "functions"),
    (CHAT, {"suffix": ""}, "suffix"),  # a completions field is unknown on chat
])
def test_openai_bodies_refuse_non_neutral_fields_naming_them(surface, body, param):
    with pytest.raises(InvalidRequestError) as info:
        surface.check({"model": "m"} | body)
    assert info.value.param == param


def test_openai_neutral_values_pass():
    COMPLETIONS.check({"best_of": 1, "echo": False, "suffix": "", "min_tokens": 0, "frequency_penalty": 0,
                       "logit_bias": {}, "user": "u", "stream_options": {"include_usage": True}})
    CHAT.check({"tools": [], "tool_choice": "none", "parallel_tool_calls": True, "store": False,
                "service_tier": "auto", "modalities": ["text"], "chat_template_kwargs": {"x": 1}})


def test_every_refusal_rule_has_a_reason_for_its_400():
    for surface in (GENERATE, SAMPLING, COMPLETIONS, CHAT):
        for name, rule in surface.rules.items():
            assert rule.support is Support.IMPLEMENTED or rule.why, f"{surface.title}.{name} refuses without a reason"


def test_same_value_keeps_json_types_apart():
    assert same_value(0, 0.0) and same_value(1.0, 1) and same_value({}, {}) and same_value([], [])
    assert not same_value(True, 1) and not same_value(1, True) and not same_value(0, False)
    assert not same_value("1", 1) and not same_value([], {})
