"""The seed's window (SGLang #34112 / #34149), driven step by step on any device: a chunked prefill
is aborted while its final chunk's result is still pending. Shared by the CPU tests (test_abort.py,
test_prefix_cache.py) and the CUDA ones."""
from __future__ import annotations

import torch
from scripted import ScriptedRuntime

from commitlog import FinishReason, Kind
from server.outputs import AbortStatus


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def drive_to_final_chunk_pending(rt: ScriptedRuntime, rid: str, prompt_len: int = 40):
    """Launches chunks (each overtaking the previous result, as run_step does) until only the final
    chunk is in flight and its result unprocessed."""
    req = rt.submit(prompt(prompt_len, 1), rid, max_new_tokens=8)
    while req.scheduled_prefill_len < req.prompt_len:
        rt.sched.launch_next()
        while len(rt.sched.inflight) > 1:
            rt.sched.process_oldest()
        rt.sched.flush()
    assert rt.sched.chunked_req is None
    assert [h.batch.samples for h in rt.sched.inflight] == [[True]], "only the final chunk may be pending"
    assert req.output_ids == [] and req.inflight_batches == 1
    return req


def check_abort_with_final_chunk_pending(rt: ScriptedRuntime) -> None:
    """Zero committed tokens; watermark and allocation unchanged by the abort; no later batch holds the
    request; its row and KV released; the log says ABORT_REQUESTED, DISCARD, FINISH; KV at baseline."""
    baseline_live = rt.sched.kv_live_tokens
    other = rt.submit(prompt(5, 2), "other", max_new_tokens=30)
    rt.step()
    req = drive_to_final_chunk_pending(rt, "victim")
    watermark, allocated, used = req.state.kv_committed_len, req.kv_allocated_len, rt.sched.kv_pool.num_used
    launches = len(rt.launched)
    answer = rt.abort("victim")
    assert answer.status is AbortStatus.ABORTED and answer.completion_tokens == 0 and answer.lsn
    rt.sched.launch_next()  # the next schedule: the other request's decode only
    assert rt.launched[launches:] and rt.batches_with(req, after=launches) == [] and other in rt.launched[-1].reqs
    assert req.kv_allocated_len in (allocated, 0) and req.state.kv_committed_len == watermark
    assert rt.sched.kv_pool.num_used <= used + 1, "only the other request's decode slot may be new"
    rt.sched.process_oldest()  # the final chunk's result: discarded
    rt.sched.flush()
    rt.wait_durable()
    assert req.state.finish_reason is FinishReason.ABORT and req.output_ids == []
    assert req.pool_row is None and req.kv_allocated_len == 0
    assert rt.kinds("victim")[-3:] == [Kind.ABORT_REQUESTED, Kind.DISCARD, Kind.FINISH]
    assert all(r.payload["ids"] == [] for r in rt.records("victim") if r.kind is Kind.COMMIT)
    assert rt.client.tokens["victim"] == [] and rt.client.finish["victim"]["type"] == "abort"
    assert next(r for r in rt.records("victim") if r.kind is Kind.ABORT_REQUESTED).lsn == answer.lsn
    rt.drain()
    assert rt.batches_with(req, after=launches) == []
    rt.sched.check_integrity()
    assert rt.sched.kv_live_tokens == baseline_live == 0, "KV not back at baseline after the drain"
