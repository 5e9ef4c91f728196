"""The commit protocol under aborts (DESIGN I1–I4), stopped inside the overlap window."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from abort_window import check_abort_with_final_chunk_pending, drive_to_final_chunk_pending, prompt
from scripted import ScriptedRuntime

from commitlog import FinishReason, Kind
from server.outputs import AbortStatus

CHUNK = 16


@pytest.fixture
def rt(tiny_checkpoint, tmp_path):
    runtime = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log", chunked_prefill_size=CHUNK)
    yield runtime
    runtime.drain()
    sched = runtime.sched
    sched.check_integrity()
    assert sched.kv_live_tokens == 0, "KV not back at baseline after drain"
    runtime.close()


def test_i2_abort_with_pending_final_extend_commits_nothing(rt):
    check_abort_with_final_chunk_pending(rt)  # the same window and checks the CUDA suite runs


def test_i2_abort_after_final_extend_processed_counts_the_committed_token(rt):
    req = drive_to_final_chunk_pending(rt, "late")
    rt.sched.process_oldest()  # the result is processed before the abort: its token commits
    rt.sched.flush()
    rt.wait_durable()
    answer = rt.abort("late")
    assert answer.status is AbortStatus.ABORTED and answer.completion_tokens == 1
    rt.drain()
    assert len(req.output_ids) == 1 and req.state.finish_reason is FinishReason.ABORT
    assert rt.client.tokens["late"] == req.output_ids
    assert Kind.DISCARD not in rt.kinds("late")


def test_i2_doomed_member_is_excluded_while_decode_members_keep_their_path(rt, tiny_checkpoint, tmp_path):
    a = rt.submit(prompt(6, 3), "a", max_new_tokens=12)
    b = rt.submit(prompt(9, 4), "b", max_new_tokens=12)
    rt.step()
    rt.step()
    c = drive_to_final_chunk_pending(rt, "c")
    launches = len(rt.launched)
    rt.abort("c")
    rt.drain()
    after = rt.launched[launches:]
    assert after and all(c not in batch.reqs for batch in after)
    assert all(a in batch.reqs and b in batch.reqs for batch in after if batch.mode.value == "decode")
    # The survivors' tokens are exactly what they produce without the aborted neighbour.
    ref = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "ref", chunked_prefill_size=CHUNK)
    ra, rb = ref.submit(prompt(6, 3), "a", max_new_tokens=12), ref.submit(prompt(9, 4), "b", max_new_tokens=12)
    ref.drain()
    ref.close()
    assert (a.output_ids, b.output_ids) == (ra.output_ids, rb.output_ids)
    assert len(a.output_ids) == 12 and c.output_ids == []


def test_i3_discarded_segment_still_advances_packed_cursors(rt, tiny_checkpoint, tmp_path):
    opts = dict(max_new_tokens=3, return_logprob=True, top_logprobs_num=3, return_hidden_states=True)
    first = rt.submit(prompt(5, 5), "first", **opts)
    second = rt.submit(prompt(8, 6), "second", **opts)
    rt.sched.launch_next()  # both whole prompts in one extend: one packed result, both sample
    assert [r.rid for r in rt.launched[-1].reqs] == ["first", "second"] and rt.launched[-1].samples == [True, True]
    rt.abort("first")
    rt.drain()
    ref = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "ref", chunked_prefill_size=CHUNK)
    ref_second = ref.submit(prompt(8, 6), "second", **opts)
    ref.drain()
    ref.close()
    # The aborted one attached nothing; the second read its own slices, not the first's.
    assert first.output_ids == [] and first.state.output_logprobs == [] and first.state.hidden_states == []
    assert second.output_ids == ref_second.output_ids
    assert second.state.output_logprobs == pytest.approx(ref_second.state.output_logprobs, abs=1e-5)
    top, ref_top = second.state.output_top_logprobs[0], ref_second.state.output_top_logprobs[0]
    assert [t for t, _ in top] == [t for t, _ in ref_top]
    assert [lp for _, lp in top] == pytest.approx([lp for _, lp in ref_top], abs=1e-5)
    got = torch.frombuffer(bytearray(second.state.hidden_states[0]), dtype=torch.float32)
    want = torch.frombuffer(bytearray(ref_second.state.hidden_states[0]), dtype=torch.float32)
    assert torch.allclose(got, want, atol=1e-5)


def test_i2_abort_of_waiting_request_removes_it_without_any_forward(rt):
    rt.submit(prompt(20, 7), "busy", max_new_tokens=4)
    req = rt.submit(prompt(10, 8), "queued", max_new_tokens=4)
    answer = rt.abort("queued")
    assert answer.status is AbortStatus.ABORTED and answer.completion_tokens == 0
    rt.drain()
    assert rt.batches_with(req) == []
    assert rt.kinds("queued") == [Kind.BEGIN, Kind.ABORT_REQUESTED, Kind.FINISH]


def test_i2_abort_with_pending_middle_chunk_discards_it_and_schedules_no_more_chunks(rt):
    req = rt.submit(prompt(60, 9), "long", max_new_tokens=4)
    rt.sched.launch_next()  # chunk 1 of 4, result pending
    rt.abort("long")
    rt.drain()
    assert len(rt.batches_with(req)) == 1
    assert rt.kinds("long") == [Kind.BEGIN, Kind.ABORT_REQUESTED, Kind.DISCARD, Kind.FINISH]
    assert req.state.kv_committed_len == 0


def test_i2_abort_of_decoding_request_with_pending_result_keeps_committed_tokens_only(rt):
    req = rt.submit(prompt(8, 10), "dec", max_new_tokens=40)
    for _ in range(4):
        rt.step()
    assert req.inflight_batches == 1
    committed = list(req.output_ids)
    answer = rt.abort("dec")
    assert answer.completion_tokens == len(committed)
    launches = len(rt.launched)
    rt.drain()
    assert rt.batches_with(req, after=launches) == []
    assert req.output_ids == committed == rt.client.tokens["dec"]
    assert rt.kinds("dec")[-3:] == [Kind.ABORT_REQUESTED, Kind.DISCARD, Kind.FINISH]
    assert rt.rebuilt("dec").output_ids == committed


@pytest.fixture
def fsync_rt(tiny_checkpoint, tmp_path):
    runtime = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log", chunked_prefill_size=CHUNK,
                              log_durability="fsync")
    yield runtime
    runtime.drain()
    runtime.sched.check_integrity()
    runtime.close()


def test_an_abort_with_a_result_pending_is_finished_and_durable_before_the_next_forward(fsync_rt):
    """Issue 11's abort latency: overlapped, the aborted request's pending result is processed
    (discarded, I2) and its FINISH written, and durable, at the start of the next step before that
    step's forward runs; not after it, one forward later. The other request runs on unchanged."""
    rt = fsync_rt
    other = rt.submit(prompt(6, 12), "other", max_new_tokens=12)
    req = rt.submit(prompt(8, 13), "dec", max_new_tokens=40)
    for _ in range(4):
        rt.step()
    assert req.inflight_batches == 1 and rt.sched.policy.overlap
    committed = list(req.output_ids)
    rt.abort("dec")
    seen: list[tuple[bool, list[Kind]]] = []
    launch = rt.sched.runner.launch

    def watch(batch):
        if not seen:  # durable before this forward starts; a read then shows what was written
            durable = rt.sched.ledger.writer.durable_lsn
            seen.append((req.is_finished and req.pool_row is None, [r.kind for r in rt.records("dec") if r.lsn <= durable]))
        return launch(batch)

    rt.sched.runner.launch = watch  # type: ignore[method-assign]
    rt.step()
    finished_before_launch, durable_before_launch = seen[0]
    assert finished_before_launch, "the aborted request still held its row when the next forward ran"
    assert durable_before_launch[-3:] == [Kind.ABORT_REQUESTED, Kind.DISCARD, Kind.FINISH]
    assert rt.sched.num_abort_syncs == 1 and rt.client.finish["dec"]["type"] == "abort"
    assert req.output_ids == committed == rt.client.tokens["dec"]
    rt.drain()
    assert len(other.output_ids) == 12


def test_abort_answers_already_finished_and_unknown(rt):
    rt.submit(prompt(4, 11), "quick", max_new_tokens=2)
    rt.drain()
    done = rt.abort("quick")
    assert done.status is AbortStatus.ALREADY_FINISHED and done.completion_tokens == 2
    assert done.finish == {"type": "length", "length": 2}
    assert rt.abort("never-seen").status is AbortStatus.UNKNOWN


def test_engine_abort_mid_generation_returns_exactly_the_acknowledged_tokens(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    results: dict[str, dict] = {}
    worker = threading.Thread(target=lambda: results.update(
        out=engine.generate(input_ids=prompt(10, 12), rid="stream-1",
                            sampling_params={"max_new_tokens": 1000, "ignore_eos": True})))
    worker.start()
    while engine.scheduler.reqs.get("stream-1") is None or not engine.scheduler.reqs["stream-1"].output_ids:
        assert worker.is_alive()
        time.sleep(0.001)
    answer = engine.abort("stream-1")
    worker.join()
    out = results["out"]
    assert answer["status"] == "aborted"
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["completion_tokens"] == answer["completion_tokens"] == len(out["output_ids"])


def test_engine_abort_all_aborts_every_live_request(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"), max_running_requests=2)
    outs: list = []
    worker = threading.Thread(target=lambda: outs.extend(engine.generate(
        input_ids=[prompt(8, s) for s in range(4)], sampling_params={"max_new_tokens": 1000, "ignore_eos": True})))
    worker.start()
    while not any(r.output_ids for r in list(engine.scheduler.reqs.values())):
        time.sleep(0.001)
    answers = engine.abort_all()
    worker.join()
    assert len(answers) == 4 and all(a["status"] == "aborted" for a in answers)
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort"] * 4
    assert sum(o["meta_info"]["completion_tokens"] == 0 for o in outs) >= 2  # two never left the queue


def test_i3_request_finished_with_a_decode_in_flight_does_not_shift_later_requests(rt, tiny_checkpoint, tmp_path):
    # The reference run tells which token "first" produces second, so a stop token can end it
    # there: a finish the scheduler cannot foresee, so its next decode is already in flight.
    ref = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "ref", chunked_prefill_size=CHUNK)
    ref_first = ref.submit(prompt(6, 11), "first", max_new_tokens=12, ignore_eos=True)
    ref_later = [ref.submit(prompt(6, 12 + i), f"later{i}", max_new_tokens=12, ignore_eos=True) for i in range(2)]
    ref.drain()
    ref.close()
    stop_token = ref_first.output_ids[1]
    assert stop_token != ref_first.output_ids[0]

    first = rt.submit(prompt(6, 11), "first", max_new_tokens=12, ignore_eos=True, stop_token_ids=[stop_token])
    later = [rt.submit(prompt(6, 12 + i), f"later{i}", max_new_tokens=12, ignore_eos=True) for i in range(2)]
    rt.drain()
    assert first.output_ids == ref_first.output_ids[:2] and first.state.finish_reason is FinishReason.STOP
    # The window: a decode holding "first" was launched before the result that finished it was processed.
    decodes = [b for b in rt.batches_with(first) if b.mode.value == "decode"]
    assert len(decodes) >= 2 and [r.rid for r in decodes[-1].reqs][0] == "first"
    assert [r.output_ids for r in later] == [r.output_ids for r in ref_later]
    assert all(rt.client.tokens[r.rid] == r.output_ids for r in later)
