"""Scheduling, stops and KV accounting: requests that do not fit wait; nothing leaks."""
from __future__ import annotations

import torch

from commitlog import FinishReason
from server.finish import check_finish
from server.sampling.params import SamplingParams

GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


def _prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_request_that_does_not_fit_waits_and_all_slots_come_back(tiny_checkpoint, make_engine):
    model_dir = tiny_checkpoint("llama")
    prompts = [_prompt(100, s) for s in range(3)]
    # Each needs 116 slots; 250 holds two at a time, so the third must wait for a finish.
    engine = make_engine(model_dir, max_total_tokens=250, chunked_prefill_size=32)
    outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    alone = make_engine(model_dir)
    for prompt, out in zip(prompts, outs):
        assert out["output_ids"] == alone.generate(input_ids=prompt, sampling_params=GREEDY)["output_ids"]
    assert engine.scheduler.kv_live_tokens == 0


def test_max_running_requests_caps_the_batch(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"), max_running_requests=2)
    seen: list[int] = []
    original = engine.scheduler.runner.launch

    def spy(batch):
        seen.append(len(batch.reqs))
        return original(batch)

    engine.scheduler.runner.launch = spy
    outs = engine.generate(input_ids=[_prompt(10, s) for s in range(5)], sampling_params=GREEDY)
    assert all(len(o["output_ids"]) == 16 for o in outs)
    assert max(seen) == 2


def test_stop_token_id_and_stop_string_end_the_output(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = _prompt(20, 9)
    full = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    stop_id = full["output_ids"][4]
    first = full["output_ids"].index(stop_id)
    out = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "stop_token_ids": [stop_id]})
    assert out["output_ids"] == full["output_ids"][: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    text = full["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    out = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "stop": stop})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.index(stop)]


def test_max_new_tokens_zero_returns_no_tokens_but_input_logprobs(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("qwen2"))
    out = engine.generate(input_ids=_prompt(12), sampling_params={"max_new_tokens": 0},
                          return_logprob=True, logprob_start_len=0)
    assert out["output_ids"] == []
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert len(out["meta_info"]["input_token_logprobs"]) == 12


def _check(output: list[int], context_len: int = 100, **params: object):
    found = check_finish(output[:-1], output[-1], 3, SamplingParams(**params), frozenset({7}), context_len, str)
    return None if found is None else found[0]


def test_finish_check_eos_ignore_eos_and_length_precedence():
    assert _check([5, 7]) is FinishReason.STOP
    assert _check([5, 7], ignore_eos=True) is None
    assert _check([5, 7], max_new_tokens=2) is FinishReason.LENGTH
    assert _check([5, 6], context_len=5) is FinishReason.LENGTH


def test_bfloat16_model_generates_and_releases_kv(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("qwen3"), dtype="bfloat16", chunked_prefill_size=16)
    outs = engine.generate(input_ids=[_prompt(40), _prompt(3, 1)], sampling_params=GREEDY)
    assert [len(o["output_ids"]) for o in outs] == [16, 16]


def test_abort_answers_unknown_and_already_finished(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    assert engine.abort("nope")["status"] == "unknown"
    out = engine.generate(input_ids=_prompt(5), sampling_params={"max_new_tokens": 2}, rid="done-1")
    assert out["meta_info"]["id"] == "done-1"
    # A finished request is answered from the log, with how it finished.
    answer = engine.abort("done-1")
    assert answer["status"] == "already_finished" and answer["completion_tokens"] == 2
    assert answer["finish_reason"]["type"] == "length"


def test_flush_cache_is_refused_while_requests_are_live_and_done_when_idle(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    during: list[bool] = []
    original = engine.scheduler.runner.launch

    def spy(batch):
        during.append(engine.scheduler.flush_cache())  # mid-generation: live requests hold committed KV
        return original(batch)

    engine.scheduler.runner.launch = spy
    engine.generate(input_ids=_prompt(10), sampling_params=GREEDY)
    assert during and not any(during)
    assert engine.scheduler.flush_cache() is True
