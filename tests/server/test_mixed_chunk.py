"""Mixed batches (`--enable-mixed-chunk`): a prefill chunk and the running decodes in one forward.
The seed's mixed-batch window, scripted: a request's final chunk is launched beside a decoding
request, aborted while that result is pending; its token is discarded, the decode member keeps
its ordinary path and its output equals a run without the aborted request (I2, I3)."""
from __future__ import annotations

import pytest
from abort_window import prompt as _prompt
from scripted import ScriptedRuntime

from commitlog import FinishReason, Kind
from server.forward_batch import ForwardMode
from server.outputs import AbortStatus

CHUNK = 16


@pytest.fixture
def rt(tiny_checkpoint, tmp_path):
    runtime = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log", chunked_prefill_size=CHUNK,
                              enable_mixed_chunk=True)
    yield runtime
    runtime.drain()
    runtime.sched.check_integrity()
    assert runtime.sched.kv_live_tokens == 0, "KV not back at baseline after drain"
    runtime.close()


def _alone(tiny_checkpoint, log_dir, prompt: list[int], max_new: int) -> list[int]:
    ref = ScriptedRuntime(tiny_checkpoint("llama"), log_dir, chunked_prefill_size=-1, disable_overlap_schedule=True)
    try:
        req = ref.submit(prompt, "alone", max_new_tokens=max_new, ignore_eos=True)
        ref.drain()
        return list(req.output_ids)
    finally:
        ref.close()


def test_i2_abort_with_pending_final_chunk_in_a_mixed_batch_discards_it_and_decode_members_match_a_run_without_it(
        rt, tiny_checkpoint, tmp_path):
    other = rt.submit(_prompt(5, 2), "other", max_new_tokens=20, ignore_eos=True)
    rt.step()  # its prefill: from here on it decodes
    victim = rt.submit(_prompt(40, 1), "victim", max_new_tokens=8, ignore_eos=True)
    while victim.scheduled_prefill_len < victim.prompt_len:
        rt.sched.launch_next()  # each chunk overtakes the previous result, as run_step does
        batch = rt.launched[-1]
        assert batch.mode is ForwardMode.MIXED and batch.reqs == [victim, other]  # extend first, then decode
        while len(rt.sched.inflight) > 1:
            rt.sched.process_oldest()
        rt.sched.flush()
    # The window: the final chunk's result is pending, in one forward with other's decode.
    (pending,) = rt.sched.inflight
    assert pending.batch.samples == [True, True] and victim.output_ids == []
    committed_before = len(other.output_ids)

    answer = rt.abort("victim")
    assert answer.status is AbortStatus.ABORTED and answer.completion_tokens == 0
    rt.sched.process_oldest()
    rt.sched.flush()
    rt.wait_durable()

    assert victim.state.finish_reason is FinishReason.ABORT and victim.output_ids == []
    assert rt.kinds("victim")[-3:] == [Kind.ABORT_REQUESTED, Kind.DISCARD, Kind.FINISH]
    assert rt.client.tokens["victim"] == []
    assert victim.pool_row is None and victim.kv_allocated_len == 0  # its row and KV released
    assert len(other.output_ids) == committed_before + 1  # the decode neighbour committed its token
    rt.drain()
    assert rt.batches_with(victim, after=len(rt.launched) - 1) == []
    # I3: the neighbour read its own slice in every mixed result.
    assert other.output_ids == rt.client.tokens["other"] == _alone(tiny_checkpoint, tmp_path / "ref", _prompt(5, 2), 20)


def test_mixed_batches_give_the_same_greedy_outputs_as_extend_then_decode(rt, tiny_checkpoint, tmp_path):
    specs = [(_prompt(50, 10 + i), 12) for i in range(4)]
    reqs = []
    for i, (prompt, max_new) in enumerate(specs):  # staggered: each arrives while the others decode
        reqs.append(rt.submit(prompt, f"m{i}", max_new_tokens=max_new, ignore_eos=True))
        rt.step()
        rt.step()
    rt.drain()
    assert any(b.mode is ForwardMode.MIXED for b in rt.launched)
    for i, (req, (prompt, max_new)) in enumerate(zip(reqs, specs)):
        assert req.output_ids == _alone(tiny_checkpoint, tmp_path / f"ref{i}", prompt, max_new)


def test_the_offline_engine_mixes_decodes_into_prefill_chunks_by_default_and_the_server_does_not(
        tiny_checkpoint, make_engine):
    """The Engine (offline: throughput) puts its running decodes into each prefill chunk's forward unless
    told not to; `tokenledger serve` (online: time to first token) keeps them apart unless asked."""
    from server.config import ServerArgs

    assert ServerArgs.from_kwargs(model_path=str(tiny_checkpoint("llama"))).enable_mixed_chunk is False
    for kwargs, mixes in (({}, True), ({"enable_mixed_chunk": False}, False)):
        engine = make_engine(tiny_checkpoint("llama"), chunked_prefill_size=CHUNK, **kwargs)
        modes: list[ForwardMode] = []
        launch = engine.scheduler.runner.launch

        def recording(batch, launch=launch, modes=modes):
            modes.append(batch.mode)
            return launch(batch)

        engine.scheduler.runner.launch = recording
        # A short prompt decodes while a long one is still prefilling in chunks of CHUNK tokens.
        engine.generate(input_ids=[_prompt(3, 1), _prompt(5 * CHUNK, 2)],
                        sampling_params={"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert engine.scheduler.policy.mixed_chunk is mixes
        assert (ForwardMode.MIXED in modes) is mixes, modes
