"""Random arrivals (some sharing a prompt prefix), chunk sizes, overlap, mixed batches and the prefix
cache on or off, and abort times: I1–I4 after every step, I6 at the end, greedy outputs equal to a
cache-off run."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from scripted import ScriptedRuntime

from commitlog import FinishReason
from server.forward_batch import ForwardMode


@dataclass(frozen=True)
class Spec:
    prompt_seed: int
    prompt_len: int
    max_new: int
    arrive: int
    abort_at: int | None
    sampled: bool
    shared: int = 0  # leading tokens taken from one prompt every request may share

    @property
    def prompt(self) -> list[int]:
        own = torch.randint(0, 500, (self.prompt_len,), generator=torch.Generator().manual_seed(self.prompt_seed))
        return SHARED_PREFIX[: self.shared] + own.tolist()

    @property
    def params(self) -> dict:
        base = {"max_new_tokens": self.max_new, "ignore_eos": True, "return_logprob": True}
        return {**base, "temperature": 0.9, "seed": self.prompt_seed} if self.sampled else base


SHARED_PREFIX = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(7)).tolist()
specs = st.builds(
    Spec, prompt_seed=st.integers(0, 10**6), prompt_len=st.integers(1, 45), max_new=st.integers(1, 7),
    arrive=st.integers(0, 12), abort_at=st.none() | st.integers(0, 18), sampled=st.booleans(),
    shared=st.sampled_from([0, 5, 17, 40, 40]),
)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint, tmp_path_factory):
    """Each request's output alone, without chunking, overlap or prefix cache: what I3/I8 say it must be."""
    rt = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path_factory.mktemp("ref"), chunked_prefill_size=-1,
                         disable_overlap_schedule=True, disable_radix_cache=True)
    cache: dict[Spec, list[int]] = {}
    counter = itertools.count()

    def get(spec: Spec) -> list[int]:
        key = Spec(spec.prompt_seed, spec.prompt_len, spec.max_new, 0, None, spec.sampled, spec.shared)
        if key not in cache:
            req = rt.submit(spec.prompt, f"ref-{next(counter)}", **spec.params)
            rt.drain()
            cache[key] = list(req.output_ids)
        return cache[key]

    yield get
    rt.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(requests=st.lists(specs, min_size=2, max_size=8), chunk=st.sampled_from([4, 8, 16, -1]), overlap=st.booleans(),
       mixed=st.booleans(), cache=st.booleans())
def test_i1_to_i4_after_every_step_and_i6_against_the_log(requests, chunk, overlap, mixed, cache, tiny_checkpoint,
                                                           tmp_path_factory, reference):
    rt = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path_factory.mktemp("log"), chunked_prefill_size=chunk,
                         disable_overlap_schedule=not overlap, enable_mixed_chunk=mixed, max_total_tokens=160,
                         max_running_requests=4, disable_radix_cache=not cache)
    live, aborted = {}, {}
    try:
        for step in range(200):
            for i, spec in enumerate(requests):
                rid = f"r{i}"
                if spec.arrive == step:
                    live[rid] = (spec, rt.submit(spec.prompt, rid, **spec.params))
                if spec.abort_at == step and rid in live and not live[rid][1].is_finished:
                    answer = rt.abort(rid)
                    aborted[rid] = (answer.completion_tokens, len(rt.launched))
            if step > max(s.arrive for s in requests) and rt.sched.is_idle:
                break
            rt.step()
            _check_step(rt, live, aborted)
        rt.drain()
        event(f"mixed batches launched: {any(b.mode is ForwardMode.MIXED for b in rt.launched)}")
        event(f"prefix cache hits: {any(req.cached_len for _, req in live.values())}")
        _check_end(rt, live, aborted, reference)
    finally:
        rt.close()


def _check_step(rt: ScriptedRuntime, live: dict, aborted: dict) -> None:
    rt.sched.check_integrity()  # I4: pools hold exactly what live requests hold
    for rid, (spec, req) in live.items():
        state = req.state
        # I1: never a partial mutation: token, logprob and watermark move together.
        assert len(state.output_logprobs) == len(state.output_ids)
        if state.output_ids:
            assert state.kv_committed_len == req.prompt_len + len(state.output_ids) - 1
        else:
            assert state.kv_committed_len <= req.prompt_len
        if rid in aborted:  # I2: nothing committed, nothing launched after the abort
            committed, launches = aborted[rid]
            assert len(state.output_ids) == committed
            assert rt.batches_with(req, after=launches) == []


def _check_end(rt: ScriptedRuntime, live: dict, aborted: dict, reference) -> None:
    assert rt.sched.kv_live_tokens == 0
    for rid, (spec, req) in live.items():
        state = req.state
        assert state.is_finished
        if rid in aborted:
            assert state.finish_reason is FinishReason.ABORT
            assert state.output_ids == reference(spec)[: len(state.output_ids)]
        else:
            assert state.finish_reason is FinishReason.LENGTH
            assert state.output_ids == reference(spec)  # I3: nobody read another's slice
        rebuilt = rt.rebuilt(rid)  # I6: the log reproduces what the server returned
        assert rebuilt.cached_tokens == state.cached_tokens <= req.cached_len < max(req.prompt_len, 1)
        assert rebuilt.output_ids == state.output_ids == rt.client.tokens[rid]
        assert rebuilt.output_logprobs == state.output_logprobs == rt.client.logprobs[rid]
        assert rebuilt.finish_reason is state.finish_reason
        assert rt.client.finish[rid]["type"] == state.finish_reason.value
