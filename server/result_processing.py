"""Applying a forward's packed result to its requests — one loop for every forward mode.

This is the commit boundary. For each request, in packed order: claim its segment of
every packed field (the cursors advance whether or not anything is applied, I3), open a
transaction, stage every mutation — input logprobs, KV watermark, token, logprobs,
hidden state, reasoning count, grammar acceptance, penalty counts, finish — then commit. A doomed
(aborted) request's commit rolls back: nothing is applied, the grammar matcher is rolled
back, a DISCARD and a FINISH(abort) are logged (I1, I2). A token the grammar rejects is
never committed: the transaction rolls back and the request finishes with an abort that
says why.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commitlog import BatchCursors, FinishReason, Ledger, Outcome, RequestTxn
from commitlog.audit import finish_reason_object
from server.finish import Detokenize, check_finish
from server.forward_batch import BatchResult, ForwardBatch
from server.outputs import RequestDelta
from server.request import Req


@dataclass(frozen=True, slots=True)
class FinishRules:
    eos_ids: frozenset[int]
    context_len: int
    detokenize: Detokenize


def process_result(
    batch: ForwardBatch, result: BatchResult, ledger: Ledger, rules: FinishRules, out: list[RequestDelta]
) -> list[Req]:
    """Applies one forward's result, extend or decode alike; returns the requests it finished
    (a committed finish or an abort).

    One loop for every mode, so the cursor rule is written once: each segment's slices are
    claimed first, before any skip, so a request that finished while this result was pending
    (a stop found one step late, an abort) still moves the cursors past its rows (I3).
    """
    step = ledger.step()
    cursors = BatchCursors.start()
    finished: list[Req] = []
    # Read once: this loop runs for every request of every step.
    samples_of, targets_of = batch.samples, batch.input_logprob_targets
    watermarks = [p + e for p, e in zip(batch.prefix_lens, batch.extend_lens)]
    for i, req in enumerate(batch.reqs):
        samples = samples_of[i]
        lp, hs, ilp = cursors.take(samples, samples and req.logprob.return_hidden_states, len(targets_of[i]))
        state = req.state
        if state.finish_reason is not None:
            continue  # finished while this result was pending: its segment is skipped, unlogged
        txn = step.open(req.rid, req.grammar, req.counts)
        delta = RequestDelta(req.rid, [], [], [], [], [], [])
        if ilp.stop > ilp.start:
            _stage_input_logprobs(txn, req, result, ilp, delta)
        if state.num_commits == 0 and req.cached_len:
            txn.note_cached_prefix(req.cached_len)
        # Absolute: a cache hit's first segment starts past the prefix it did not compute.
        txn.advance_watermark(watermarks[i])
        rejected = None
        if samples:  # a decode, or a prompt's final chunk; a middle chunk commits only its progress
            rejected = _stage_sampled(txn, req, result, lp.start, hs.start if hs.stop > hs.start else None, rules, delta)
        if _commit(txn, req, delta, out, ledger, rejected):
            finished.append(req)
    return finished


def _stage_input_logprobs(txn: RequestTxn, req: Req, result: BatchResult, ilp: slice, delta: RequestDelta) -> None:
    """Prompt logprobs this forward scored for the request (a chunk's share), with their top-k if asked."""
    delta.input_logprobs = result.input_logprobs[ilp]
    if not delta.input_logprobs:
        return
    k = req.logprob.top_logprobs_num
    top = [list(zip(ids[:k], lps[:k])) for ids, lps in zip(result.input_top_ids[ilp], result.input_top_logprobs[ilp])]
    txn.add_input_logprobs(delta.input_logprobs, top if k else None)
    if k:
        delta.input_top_logprobs = top


def _stage_sampled(
    txn: RequestTxn, req: Req, result: BatchResult, i: int, hidden: int | None, rules: FinishRules,
    delta: RequestDelta,
) -> str | None:
    """Stages the sampled token and what follows from it; returns why the grammar rejected it, if it did."""
    if hidden is not None:
        row = result.hidden_states[hidden]
        txn.add_hidden_state(row.numpy().astype(np.float32).tobytes())
        delta.hidden_states.append(row.tolist())
    params = req.params
    if params.max_new_tokens == 0:
        # Prompt-only request: the prefill ran for its input logprobs; no token is kept.
        txn.set_finish(FinishReason.LENGTH, 0)
        return None
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
    committed = req.state.output_ids
    masked = req.grammar is not None and req.is_grammar_active  # decided on the committed state, as the sampler's mask was
    if req.reasoning is not None and (reasoning := req.reasoning.step(req.state, token)) is not None:
        txn.add_reasoning(*reasoning)
    if masked and not txn.accept_grammar(token):
        return f"grammar rejected token {token} ({rules.detokenize([token])!r}) after {len(committed)} output token(s)"
    finish = check_finish(committed, token, req.prompt_len, params, rules.eos_ids, rules.context_len, rules.detokenize)
    if finish is None and masked and req.grammar is not None and req.grammar.is_terminated:
        finish = (FinishReason.STOP, token)  # the grammar is complete (its stop token accepted)
    if finish is not None:
        txn.set_finish(*finish)
    return None


def _commit(txn: RequestTxn, req: Req, delta: RequestDelta, out: list[RequestDelta], ledger: Ledger,
            rejected: str | None) -> bool:
    """Commits (or, if doomed or rejected, rolls back) and queues the delta; True if the request finished."""
    if rejected is not None:
        txn.rollback(rejected)
        if not req.state.is_finished:  # a doomed request was finished by the rollback already
            ledger.finish(req.rid, FinishReason.ABORT, rejected)
        delta = RequestDelta(rid=req.rid)
    elif txn.commit() is Outcome.DISCARDED:
        delta = RequestDelta(rid=req.rid)  # nothing of the staged result reaches the client
    delta.completion_tokens = len(req.state.output_ids)
    delta.cached_tokens = req.state.cached_tokens
    delta.reasoning_tokens = req.state.num_reasoning_tokens
    delta.finish = finish_reason_object(req.state)
    out.append(delta)
    return req.state.is_finished
