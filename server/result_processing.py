"""Applying a forward's packed result to its requests — one function per forward mode.

Both walk the batch in packed order with explicit cursors into the result's packed
fields. Every segment advances the cursors, applied or skipped, so each request reads its
own slice (I3). This is the commit boundary: every per-request mutation a result causes
happens here and nowhere else.
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

    def take(self, req: Req, samples: bool, num_input_logprobs: int) -> tuple[int | None, slice, int | None]:
        """Claims one request's segment: (sample index, input-logprob slice, hidden row)."""
        lp = slice(self.input_logprob, self.input_logprob + num_input_logprobs)
        self.input_logprob += num_input_logprobs
        sample = hidden = None
        if samples:
            sample, self.sample = self.sample, self.sample + 1
            if req.logprob.return_hidden_states:
                hidden, self.hidden = self.hidden, self.hidden + 1
        return sample, lp, hidden


def process_extend_result(batch: ForwardBatch, result: BatchResult, out: list[RequestDelta]) -> list[Req]:
    """Returns the requests that sampled a token this step (they get the finish check)."""
    cur = PackedCursors()
    sampled: list[Req] = []
    for i, req in enumerate(batch.reqs):
        targets = batch.input_logprob_targets[i]
        sample, lp, hidden = cur.take(req, batch.samples[i], len(targets))
        if req.is_finished:
            continue  # finished while this result was pending: its segment is skipped
        delta = RequestDelta(rid=req.rid)
        if targets:
            delta.input_logprobs = _with_first_position(batch.prefix_lens[i], req, result.input_logprobs[lp])
            req.input_logprobs.extend(delta.input_logprobs)
        req.prefilled_len += batch.extend_lens[i]
        req.kv_committed_len += batch.extend_lens[i]
        if sample is not None:
            _append_sampled(req, result, sample, hidden, delta)
            sampled.append(req)
        out.append(delta)
    return sampled


def process_decode_result(batch: ForwardBatch, result: BatchResult, out: list[RequestDelta]) -> list[Req]:
    cur = PackedCursors()
    sampled: list[Req] = []
    for req in batch.reqs:
        sample, _, hidden = cur.take(req, True, 0)
        if req.is_finished:
            continue
        assert sample is not None
        delta = RequestDelta(rid=req.rid)
        req.kv_committed_len += 1
        _append_sampled(req, result, sample, hidden, delta)
        sampled.append(req)
        out.append(delta)
    return sampled


def _append_sampled(req: Req, result: BatchResult, i: int, hidden: int | None, delta: RequestDelta) -> None:
    if hidden is not None:
        delta.hidden_states = [result.hidden_states[hidden].tolist()]
        req.hidden_states.extend(delta.hidden_states)
    if req.params.max_new_tokens == 0:
        return  # prompt-only request: the prefill ran for its input logprobs, no token is kept
    token = result.next_token_ids[i]
    req.output_ids.append(token)
    delta.token_ids.append(token)
    if req.logprob.return_logprob:
        logprob = result.next_token_logprobs[i]
        req.output_logprobs.append(logprob)
        delta.logprobs.append(logprob)
        k = req.logprob.top_logprobs_num
        if k:
            top = list(zip(result.top_ids[i][:k], result.top_logprobs[i][:k]))
            req.output_top_logprobs.append(top)
            delta.top_logprobs.append(top)


def _with_first_position(prefix_len: int, req: Req, values: list[float]) -> list[float | None]:
    # Position 0 has no preceding context; like SGLang it is reported as None.
    if prefix_len == 0 and req.logprob.logprob_start_len == 0:
        return [None, *values]
    return list(values)
