"""Structured output end to end through the Engine: every constrained output is valid, at
temperature > 0 with seeds; bad constraints are 400-style errors before any forward; overlap
on and off agree; the compile cache is used."""
from __future__ import annotations

import json
import re

import pytest

from server.errors import InvalidRequestError

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        # Bounded: an unbounded integer lets a random model emit digits up to its length limit.
        "count": {"type": "integer", "minimum": -50, "maximum": 5000},
        "size": {"enum": ["S", "M", "L"]},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "count", "size"],
    "additionalProperties": False,
}
REGEX = r"(cat|dog)-[0-9]{2,4}(\.[a-z]{1,3})?"
N = 24  # >= 20 requests each


def check_against_schema(value: object) -> None:
    """A small validator for SCHEMA: types, enums, required fields, no extra fields."""
    assert isinstance(value, dict), value
    props = SCHEMA["properties"]
    assert set(value) <= set(props), f"extra fields {set(value) - set(props)}"
    assert set(SCHEMA["required"]) <= set(value), f"missing {set(SCHEMA['required']) - set(value)}"
    for name, item in value.items():
        rule = props[name]
        if "enum" in rule:
            assert item in rule["enum"], (name, item)
        elif rule["type"] == "integer":
            assert isinstance(item, int) and not isinstance(item, bool), (name, item)
            assert rule["minimum"] <= item <= rule["maximum"], (name, item)
        elif rule["type"] == "boolean":
            assert isinstance(item, bool), (name, item)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    from server import Engine

    e = Engine(model_path=str(tiny_checkpoint("llama")), max_total_tokens=8192)
    yield e
    e.shutdown()
    assert e.scheduler.kv_live_tokens == 0


def _prompts(n: int) -> list[str]:
    return [f"request {i}: describe item {i * 7 % 13}" for i in range(n)]


def test_json_schema_outputs_parse_and_validate_at_temperature(engine):
    params = [{"json_schema": json.dumps(SCHEMA), "temperature": 1.0, "seed": 100 + i, "max_new_tokens": 96}
              for i in range(N)]
    outs = engine.generate(_prompts(N), sampling_params=params)
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out  # the grammar completed
        check_against_schema(json.loads(out["text"]))
    assert len({o["text"] for o in outs}) > 1  # really sampled, not one fixed string


def test_regex_outputs_fully_match_at_temperature(engine):
    params = [{"regex": REGEX, "temperature": 0.9, "top_p": 0.95, "seed": i, "max_new_tokens": 32} for i in range(N)]
    outs = engine.generate(_prompts(N), sampling_params=params)
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert re.fullmatch(REGEX, out["text"]), out["text"]
    assert len({o["text"] for o in outs}) > 1


def test_ebnf_and_json_object_constrain_too(engine):
    out = engine.generate("x", sampling_params={"ebnf": 'root ::= "yes" | "no" | "maybe"', "temperature": 0.7,
                                                "seed": 5, "max_new_tokens": 8})
    assert out["text"] in ("yes", "no", "maybe") and out["meta_info"]["finish_reason"]["type"] == "stop"
    out = engine.generate("y", sampling_params={"json_schema": {"type": "object", "properties": {
        "a": {"type": "integer", "maximum": 99}}, "required": ["a"]}, "temperature": 0, "max_new_tokens": 40})
    assert isinstance(json.loads(out["text"])["a"], int)


def test_constrained_and_unconstrained_share_a_batch(engine):
    params = [{"regex": REGEX, "temperature": 0, "max_new_tokens": 32}, {"temperature": 0, "max_new_tokens": 12,
                                                                        "ignore_eos": True}] * 4
    outs = engine.generate(_prompts(8), sampling_params=params)
    for i, out in enumerate(outs):
        if i % 2 == 0:
            assert re.fullmatch(REGEX, out["text"])
        else:
            assert out["meta_info"]["completion_tokens"] == 12


@pytest.mark.parametrize(("sampling", "param"), [
    ({"regex": "(unclosed"}, "regex"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"json_schema": json.dumps({"type": "nonsense"})}, "json_schema"),
    ({"ebnf": "root ::= missing_rule"}, "ebnf"),
    ({"regex": "a", "json_schema": "{}"}, "regex"),
])
def test_invalid_constraint_is_rejected_before_any_forward(engine, sampling, param):
    steps = len(engine.scheduler.counters.step_seconds)
    with pytest.raises(InvalidRequestError) as info:
        engine.generate("z", sampling_params={**sampling, "max_new_tokens": 4})
    assert info.value.param == param and str(info.value)
    assert len(engine.scheduler.counters.step_seconds) == steps and engine.scheduler.is_idle


def test_compiled_grammars_are_cached_by_key(engine):
    compiler = engine.scheduler.grammars
    regex = r"[0-9]{3}"
    engine.generate("a", sampling_params={"regex": regex, "max_new_tokens": 8})
    before = compiler.num_compiled
    engine.generate(["b", "c"], sampling_params={"regex": regex, "max_new_tokens": 8})
    assert compiler.num_compiled == before


def test_i8_constrained_greedy_is_identical_with_and_without_overlap(tiny_checkpoint, make_engine):
    outputs = []
    for disable in (False, True):
        e = make_engine(tiny_checkpoint("qwen2"), disable_overlap_schedule=disable, chunked_prefill_size=16)
        params = ([{"json_schema": json.dumps(SCHEMA), "temperature": 0, "max_new_tokens": 80},
                   {"regex": REGEX, "temperature": 0, "max_new_tokens": 24},
                   {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}] * 3)
        prompts = [f"{p} {'padding ' * (i % 4) * 5}" for i, p in enumerate(_prompts(9))]
        outs = e.generate(prompts, sampling_params=params)
        outputs.append([o["output_ids"] for o in outs])
        if not disable:
            assert e.scheduler.num_grammar_syncs > 0  # the overlap run really had to wait for commits
    assert outputs[0] == outputs[1]
