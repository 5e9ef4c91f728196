"""Applying a forward's packed result to its requests — one function per forward mode.

Both walk the batch in packed order with explicit cursors into the result's packed
fields. This is the commit boundary: every per-request mutation a result causes happens
here and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass

from server.forward_batch import BatchResult, ForwardBatch
from server.outputs import RequestDelta
from server.request import Req


@dataclass(slots=True)
class PackedCursors:
    """Where the next request's slice of each packed field begins."""

    sample: int = 0
    input_logprob: int = 0
    hidden: int = 0


def process_extend_result(batch: ForwardBatch, result: BatchResult, deltas: list[RequestDelta]) -> list[Req]:
    """Returns the requests that sampled their first token (ready for the finish check)."""
    cur = PackedCursors()
    sampled: list[Req] = []
    for i, req in enumerate(batch.reqs):
        delta = RequestDelta(rid=req.rid)
        targets = batch.input_logprob_targets[i]
        if targets:
            values = result.input_logprobs[cur.input_logprob : cur.input_logprob + len(targets)]
            cur.input_logprob += len(targets)
            delta.input_logprobs = _with_first_position(batch.prefix_lens[i], req, list(values))
            req.input_logprobs.extend(delta.input_logprobs)
        req.prefilled_len += batch.extend_lens[i]
        req.kv_committed_len += batch.extend_lens[i]
        if batch.samples[i]:
            _append_sampled(req, result, cur, delta)
            sampled.append(req)
        deltas.append(delta)
    return sampled


def process_decode_result(batch: ForwardBatch, result: BatchResult, deltas: list[RequestDelta]) -> list[Req]:
    cur = PackedCursors()
    for req in batch.reqs:
        delta = RequestDelta(rid=req.rid)
        req.kv_committed_len += 1
        _append_sampled(req, result, cur, delta)
        deltas.append(delta)
    return list(batch.reqs)


def _append_sampled(req: Req, result: BatchResult, cur: PackedCursors, delta: RequestDelta) -> None:
    token = result.next_token_ids[cur.sample]
    logprob = result.next_token_logprobs[cur.sample]
    k = req.logprob.top_logprobs_num
    top = list(zip(result.top_ids[cur.sample][:k], result.top_logprobs[cur.sample][:k]))
    cur.sample += 1
    if req.logprob.return_hidden_states:
        delta.hidden_states = [result.hidden_states[cur.hidden].tolist()]
        cur.hidden += 1
        req.hidden_states.extend(delta.hidden_states)
    if req.params.max_new_tokens == 0:
        return  # prompt-only request: the prefill ran for its input logprobs, no token is kept
    req.output_ids.append(token)
    delta.token_ids.append(token)
    if req.logprob.return_logprob:
        req.output_logprobs.append(logprob)
        delta.logprobs.append(logprob)
        if k:
            req.output_top_logprobs.append(top)
            delta.top_logprobs.append(top)


def _with_first_position(prefix_len: int, req: Req, values: list[float | None]) -> list[float | None]:
    # Position 0 has no preceding context; like SGLang it is reported as None.
    if prefix_len == 0 and req.logprob.logprob_start_len == 0:
        return [None, *values]
    return values
