"""Applying a forward's packed result to its requests — one function per forward mode.

This is the commit boundary. For each request, in packed order: claim its segment of
every packed field (the cursors advance whether or not anything is applied, I3), open a
transaction, stage every mutation — input logprobs, KV watermark, token, logprobs,
hidden state, finish — then commit. A doomed (aborted) request's commit rolls back:
nothing is applied, a DISCARD and a FINISH(abort) are logged (I1, I2).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commitlog import BatchCursors, FinishReason, Outcome, RequestTxn, Step
from server.finish import Detokenize, check_finish
from server.forward_batch import BatchResult, ForwardBatch
from server.outputs import RequestDelta
from server.request import Req, finish_reason_dict


@dataclass(frozen=True, slots=True)
class FinishRules:
    eos_ids: frozenset[int]
    context_len: int
    detokenize: Detokenize


def process_extend_result(
    batch: ForwardBatch, result: BatchResult, step: Step, rules: FinishRules, out: list[RequestDelta]
) -> list[Req]:
    """Returns the requests this result finished (a committed finish or an abort)."""
    cursors = BatchCursors.start()
    finished: list[Req] = []
    for i, req in enumerate(batch.reqs):
        samples = batch.samples[i]
        lp, hs, ilp = cursors.take(int(samples), int(samples and req.logprob.return_hidden_states),
                                   len(batch.input_logprob_targets[i]))
        if req.is_finished:
            continue  # finished while this result was pending: its segment is skipped, unlogged
        txn = step.open(req.rid)
        delta = RequestDelta(rid=req.rid, input_logprobs=result.input_logprobs[ilp])
        if delta.input_logprobs:
            txn.add_input_logprobs(delta.input_logprobs)
        txn.advance_watermark(req.state.kv_committed_len + batch.extend_lens[i])
        if samples:  # the final chunk; a middle chunk commits only its progress
            _stage_sampled(txn, req, result, lp.start, hs.start if hs.stop > hs.start else None, rules, delta)
        if _commit(txn, req, delta, out):
            finished.append(req)
    return finished


def process_decode_result(
    batch: ForwardBatch, result: BatchResult, step: Step, rules: FinishRules, out: list[RequestDelta]
) -> list[Req]:
    cursors = BatchCursors.start()
    finished: list[Req] = []
    for req in batch.reqs:
        lp, hs, _ = cursors.take(1, int(req.logprob.return_hidden_states))
        if req.is_finished:
            continue
        txn = step.open(req.rid)
        delta = RequestDelta(rid=req.rid)
        txn.advance_watermark(req.state.kv_committed_len + 1)
        _stage_sampled(txn, req, result, lp.start, hs.start if hs.stop > hs.start else None, rules, delta)
        if _commit(txn, req, delta, out):
            finished.append(req)
    return finished


def _stage_sampled(
    txn: RequestTxn, req: Req, result: BatchResult, i: int, hidden: int | None, rules: FinishRules,
    delta: RequestDelta,
) -> None:
    if hidden is not None:
        row = result.hidden_states[hidden]
        txn.add_hidden_state(row.numpy().astype(np.float32).tobytes())
        delta.hidden_states.append(row.tolist())
    if req.params.max_new_tokens == 0:
        # Prompt-only request: the prefill ran for its input logprobs; no token is kept.
        txn.set_finish(FinishReason.LENGTH, 0)
        return
    token = result.next_token_ids[i]
    logprob = top = None
    if req.logprob.return_logprob:
        logprob = result.next_token_logprobs[i]
        k = req.logprob.top_logprobs_num
        top = list(zip(result.top_ids[i][:k], result.top_logprobs[i][:k])) if k else None
    txn.append_token(token, logprob, top)
    delta.token_ids.append(token)
    if logprob is not None:
        delta.logprobs.append(logprob)
    if top is not None:
        delta.top_logprobs.append(top)
    finish = check_finish([*req.output_ids, token], req.prompt_len, req.params, rules.eos_ids,
                          rules.context_len, rules.detokenize)
    if finish is not None:
        txn.set_finish(*finish)


def _commit(txn: RequestTxn, req: Req, delta: RequestDelta, out: list[RequestDelta]) -> bool:
    """Commits (or, if doomed, rolls back) and queues the delta; True if the request finished."""
    if txn.commit() is Outcome.DISCARDED:
        delta = RequestDelta(rid=req.rid)  # nothing of the staged result reaches the client
    delta.completion_tokens = len(req.state.output_ids)
    delta.finish = finish_reason_dict(req.state)
    out.append(delta)
    return req.state.is_finished
