"""Grammar state inside the transaction (DESIGN I1/I2 for the matcher): after any abort or
discard the matcher has accepted exactly the committed tokens; a token the grammar rejects
ends the request with a clear abort, never a crash or an unconstrained token."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from commitlog import FinishReason, Kind
from server.grammar.matcher import RequestGrammar

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from scripted import ScriptedRuntime  # noqa: E402

REGEX = r"(cat|dog)-[0-9]{2,6}\.[a-z]{2,8}"


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(5, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def rt(tiny_checkpoint, tmp_path):
    runtime = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log", chunked_prefill_size=16)
    yield runtime
    runtime.drain()
    runtime.sched.check_integrity()
    assert runtime.sched.kv_live_tokens == 0
    runtime.close()


def _submit(rt: ScriptedRuntime, rid: str, seed: int, prompt_len: int = 6, **params):
    req = rt.submit(_prompt(prompt_len, seed), rid, **{"regex": REGEX, "max_new_tokens": 40, **params})
    req.grammar_future.result(timeout=60)  # compiled off the loop; admitted at the next schedule
    rt.sched.admit_compiled_grammars()
    assert req.grammar is not None
    return req


class SpyGrammar(RequestGrammar):
    __slots__ = ("calls",)

    def __init__(self, matcher) -> None:
        super().__init__(matcher)
        self.calls: list[int] = []

    def accept_token(self, token_id: int) -> bool:
        self.calls.append(token_id)
        return super().accept_token(token_id)


def assert_matcher_holds_committed(rt: ScriptedRuntime, req) -> None:
    """The matcher's accepted tokens are the committed ones, and its state is a fresh
    matcher's after exactly those tokens (same next-token mask)."""
    import xgrammar as xgr

    assert req.grammar.accepted == req.output_ids
    compiled = rt.sched.grammars.compile(req.params.grammar)
    fresh = rt.sched.grammars.matcher(compiled)
    assert all(fresh.accept_token(t) for t in req.output_ids)
    vocab = rt.runtime.model_config.vocab_size
    masks = xgr.allocate_token_bitmask(2, vocab)
    req.grammar.fill_mask(masks, 0)
    fresh.fill_mask(masks, 1)
    assert torch.equal(masks[0], masks[1])


def _to_pending_decode(rt: ScriptedRuntime, reqs: list, committed: int) -> None:
    """Steps (overlap on) until each request has `committed` tokens and one decode batch holding
    all of them is launched with its result pending."""
    def ready() -> bool:
        pending = rt.sched.inflight
        return (min(len(r.output_ids) for r in reqs) >= committed and len(pending) == 1
                and all(r in pending[0].batch.reqs for r in reqs))

    for _ in range(50):
        if ready():
            break
        rt.step()
    assert ready()
    batch = rt.sched.inflight[-1].batch
    assert all(r in batch.reqs and r.inflight_tokens == 1 for r in reqs)


def test_grammar_abort_with_pending_decode_result_matcher_holds_exactly_committed_tokens(rt):
    req = _submit(rt, "g", 1)
    req.grammar = spy = SpyGrammar(req.grammar.matcher)
    _to_pending_decode(rt, [req], committed=3)
    committed = list(req.output_ids)

    rt.abort("g")
    rt.sched.process_oldest()  # the pending result: its token is staged in the matcher, then rolled back
    rt.sched.flush()
    rt.wait_durable()

    assert len(spy.calls) == len(committed) + 1  # the discarded token really reached the matcher
    assert req.state.finish_reason is FinishReason.ABORT and req.output_ids == committed
    assert_matcher_holds_committed(rt, req)
    assert rt.kinds("g")[-3:] == [Kind.ABORT_REQUESTED, Kind.DISCARD, Kind.FINISH]
    assert rt.client.tokens["g"] == committed


def test_grammar_discard_in_mixed_batch_rolls_back_only_the_aborted_matcher(rt):
    victim, other = _submit(rt, "victim", 2), _submit(rt, "other", 3)
    plain = rt.submit(_prompt(5, 4), "plain", max_new_tokens=30, ignore_eos=True)
    _to_pending_decode(rt, [victim, other, plain], committed=2)
    before_victim, before_other = list(victim.output_ids), list(other.output_ids)

    rt.abort("victim")
    rt.sched.process_oldest()  # one packed result: victim discarded, other and plain committed
    rt.sched.flush()
    rt.wait_durable()

    assert victim.output_ids == before_victim and victim.state.finish_reason is FinishReason.ABORT
    assert other.output_ids[: len(before_other)] == before_other and len(other.output_ids) == len(before_other) + 1
    assert_matcher_holds_committed(rt, victim)
    assert_matcher_holds_committed(rt, other)
    rt.drain()
    assert re.fullmatch(REGEX, rt.runtime.tokenizer.decode(other.output_ids)), other.output_ids


def test_grammar_abort_with_pending_final_extend_leaves_matcher_empty(rt):
    req = _submit(rt, "chunky", 5, prompt_len=40)
    while req.scheduled_prefill_len < req.prompt_len:
        rt.sched.launch_next()
        while len(rt.sched.inflight) > 1:
            rt.sched.process_oldest()
        rt.sched.flush()
    assert req.inflight_tokens == 1 and req.output_ids == []
    rt.abort("chunky")
    rt.sched.process_oldest()
    rt.sched.flush()
    rt.wait_durable()
    assert req.grammar.accepted == [] and req.output_ids == []
    assert_matcher_holds_committed(rt, req)


def test_grammar_rejected_token_ends_the_request_with_a_clear_abort(rt, monkeypatch):
    import server.grammar.mask as mask

    monkeypatch.setattr(mask, "apply_grammar_masks", lambda logits, grammars: None)  # a broken mask
    req = _submit(rt, "rej", 6, regex=r"[0-9]{30}")
    rt.drain()
    finish = rt.client.finish["rej"]
    assert finish["type"] == "abort" and "grammar rejected token" in finish["message"], finish
    assert_matcher_holds_committed(rt, req)  # whatever was committed before the rejection was accepted
    assert all(ch.isdigit() for ch in rt.runtime.tokenizer.decode(req.output_ids))
    records = rt.records("rej")
    assert [r.kind for r in records][-2:] == [Kind.DISCARD, Kind.FINISH]
    assert "grammar rejected token" in records[-2].payload["reason"]
    assert rt.rebuilt("rej").output_ids == req.output_ids  # I6: the log holds what was committed
    rt.wait_durable()
    verify = subprocess.run([sys.executable, "-m", "ops.cli", "verify", "--log-dir", str(rt.runtime.log_dir)],
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr  # a rejection is a well-formed abort


def test_grammar_termination_finishes_with_stop(rt):
    req = _submit(rt, "done", 7, regex=r"(yes|no)", max_new_tokens=30)
    rt.drain()
    assert req.state.finish_reason is FinishReason.STOP
    assert rt.runtime.tokenizer.decode(req.output_ids) in ("yes", "no")
    assert req.grammar.is_terminated and req.state.num_grammar_tokens == len(req.output_ids)
