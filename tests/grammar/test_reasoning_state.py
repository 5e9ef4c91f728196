"""Reasoning state in the transaction (--reasoning-parser): the count and the end marker are
staged per result, a discarded result counts nothing, and a grammar applies only after
`</think>`; meta_info reports reasoning_tokens."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import server.model_runner as model_runner
from commitlog import FinishReason

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from scripted import ScriptedRuntime  # noqa: E402


def _force(monkeypatch, script: list[int]) -> None:
    """The sampler emits `script` first (one request per batch), then samples as usual."""
    original, queue = model_runner.sample, list(script)

    def forced(logits, params, generators, top_k_max, adjust=None, logprobs=True):
        out = original(logits, params, generators, top_k_max, adjust, logprobs)
        if queue and len(out.token_ids) == 1:
            out.token_ids[0] = queue.pop(0)
        return out

    monkeypatch.setattr(model_runner, "sample", forced)


@pytest.fixture
def rt(tiny_checkpoint, tmp_path):
    runtime = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log", reasoning_parser="deepseek-r1")
    yield runtime
    runtime.drain()
    assert runtime.sched.kv_live_tokens == 0
    runtime.close()


def _ids(rt: ScriptedRuntime) -> tuple[int, int, list[int]]:
    tok = rt.runtime.tokenizer
    return tok.token_id("<think>"), tok.token_id("</think>"), tok.encode("hmm ok")


def test_reasoning_count_and_end_are_committed_and_grammar_starts_after_think_end(rt, monkeypatch):
    _, end, thought = _ids(rt)
    _force(monkeypatch, [*thought, end])
    req = rt.submit([7, 8, 9], "r", regex=r"(yes|no)", max_new_tokens=30)
    req.grammar_future.result(timeout=60)
    rt.drain()
    n = len(thought) + 1
    assert req.state.num_reasoning_tokens == n and req.state.is_reasoning_ended
    assert req.output_ids[:n] == [*thought, end]
    answer = rt.runtime.tokenizer.decode(req.output_ids[n:])
    assert re.fullmatch(r"(yes|no)", answer) and req.state.finish_reason is FinishReason.STOP
    assert req.grammar.accepted == req.output_ids[n:]  # the matcher never saw the thinking
    rebuilt = rt.rebuilt("r")  # I6: the log holds the reasoning state too
    assert (rebuilt.num_reasoning_tokens, rebuilt.is_reasoning_ended) == (n, True)


def test_discarded_result_counts_no_reasoning(rt, monkeypatch):
    _, end, thought = _ids(rt)
    _force(monkeypatch, [*thought, end])
    req = rt.submit([7, 8, 9], "d", max_new_tokens=30)
    while len(req.output_ids) < 1 or not rt.sched.inflight:
        rt.step()
    counted = req.state.num_reasoning_tokens
    assert counted == len(req.output_ids) and req.inflight_tokens == 1
    rt.abort("d")
    rt.sched.process_oldest()
    rt.sched.flush()
    rt.wait_durable()
    assert req.state.num_reasoning_tokens == counted and not req.state.is_reasoning_ended


def test_meta_info_reports_reasoning_tokens(tiny_checkpoint, make_engine):
    e = make_engine(tiny_checkpoint("llama"), reasoning_parser="deepseek-r1")
    out = e.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 6, "ignore_eos": True, "temperature": 0})
    # A random model never closes </think>: everything it wrote is reasoning.
    assert out["meta_info"]["reasoning_tokens"] == 6
    plain = make_engine(tiny_checkpoint("llama"))
    assert plain.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 3})["meta_info"]["reasoning_tokens"] == 0
