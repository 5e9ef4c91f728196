"""Request transactions: stage a result's mutations, then commit all of them or none (I1)."""
from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from commitlog.codec import Entry, Kind
from commitlog.errors import TxnStateError
from commitlog.state import (
    Delta,
    FinishReason,
    RequestState,
    TopLogprobs,
    apply_delta,
    finish_entry,
)


class GrammarMatcher(Protocol):
    """What xgrammar's GrammarMatcher offers; staging must be undoable, so both are needed."""

    def accept_token(self, token_id: int) -> bool: ...

    def rollback(self, num_tokens: int) -> None: ...


class TokenCounter(Protocol):
    """A request's penalty counts (server.sampling.penalties.TokenCounts): fed only by `commit`."""

    def add(self, token_ids: Sequence[int]) -> None: ...


class Outcome(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    DISCARDED = "discarded"


class RequestTxn:
    """Stages one request's share of one batch result; emits exactly one COMMIT or DISCARD.

    Grammar acceptance is applied to the matcher eagerly (the next mask needs it) and undone
    with `rollback(n)` if the transaction does not commit. Everything else is applied only
    by `commit()`, penalty counts included: the staged output tokens are added to `counts`
    there and nowhere else. Entries go to `entries`, the step's group, in call order.
    """

    __slots__ = ("state", "grammar", "counts", "outcome", "_delta", "_entries", "_num_accepted")

    def __init__(self, state: RequestState, entries: list[Entry], grammar: GrammarMatcher | None = None,
                 counts: TokenCounter | None = None) -> None:
        if state.is_finished:
            raise TxnStateError(f"request {state.rid!r} already finished ({state.finish_reason})")
        self.state = state
        self.grammar = grammar
        self.counts = counts
        self.outcome = Outcome.OPEN
        self._delta = Delta()
        self._entries = entries
        self._num_accepted = 0

    def _check_open(self) -> None:
        if self.outcome is not Outcome.OPEN:
            raise TxnStateError(f"transaction for {self.state.rid!r} is already {self.outcome.value}")

    def append_token(self, token_id: int, logprob: float | None = None, top: TopLogprobs | None = None) -> None:
        """Stage one output token; logprobs are kept only when given (return_logprob)."""
        self._check_open()
        self._delta.output_ids.append(int(token_id))
        if logprob is not None:
            self._delta.output_logprobs.append(float(logprob))
        if top is not None:
            self._delta.output_top_logprobs.append([(int(i), float(lp)) for i, lp in top])

    def accept_grammar(self, token_id: int) -> bool:
        """Advance the grammar matcher now; undone on rollback. Returns the matcher's verdict."""
        self._check_open()
        if self.grammar is None:
            raise TxnStateError(f"request {self.state.rid!r} has no grammar matcher")
        accepted = self.grammar.accept_token(token_id)
        if accepted:
            self._num_accepted += 1
        return accepted

    def add_input_logprobs(self, logprobs: list[float], top: list[TopLogprobs] | None = None) -> None:
        """Stage prompt logprobs (one per scored position) and, when asked for, their top-k lists."""
        self._check_open()
        if top is not None and len(top) != len(logprobs):
            raise ValueError(f"{len(logprobs)} input logprob(s) but {len(top)} top-logprob list(s)")
        self._delta.input_logprobs.extend(float(lp) for lp in logprobs)
        if top is not None:
            self._delta.input_top_logprobs.extend([(int(i), float(lp)) for i, lp in t] for t in top)

    def add_hidden_state(self, blob: bytes) -> None:
        self._check_open()
        self._delta.hidden_states.append(bytes(blob))

    def add_reasoning(self, num_tokens: int, is_ended: bool = False) -> None:
        self._check_open()
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        self._delta.num_reasoning_tokens += num_tokens
        self._delta.is_reasoning_ended = self._delta.is_reasoning_ended or is_ended

    def advance_watermark(self, kv_committed_len: int) -> None:
        self._check_open()
        if kv_committed_len < self.state.kv_committed_len:
            raise ValueError(
                f"KV watermark only advances: {kv_committed_len} < {self.state.kv_committed_len}")
        self._delta.kv_committed_len = kv_committed_len

    def note_cached_prefix(self, num_tokens: int) -> None:
        """Records that the first `num_tokens` prompt tokens' KV came from the prefix cache."""
        self._check_open()
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        self._delta.cached_tokens = num_tokens

    def set_finish(self, reason: FinishReason, matched: int | str | None = None) -> None:
        self._check_open()
        if reason in (FinishReason.ABORT, FinishReason.INTERRUPTED):
            raise ValueError(f"{reason.value} is not a result's finish; use Ledger.doom / recovery")
        self._delta.finish_reason, self._delta.finish_matched = reason, matched

    def commit(self) -> Outcome:
        """Apply everything and log COMMIT; a doomed request is rolled back instead (I2)."""
        self._check_open()
        if self.state.is_doomed:
            return self.rollback(f"doomed: {self.state.doom_reason}")
        self._delta.num_grammar_tokens = self._num_accepted
        apply_delta(self.state, self._delta)
        if self.counts is not None:
            self.counts.add(self._delta.output_ids)
        self._entries.append(Entry(Kind.COMMIT, self.state.rid, self._delta.to_payload()))
        self.outcome = Outcome.COMMITTED
        if self.state.is_finished:
            self._entries.append(finish_entry(self.state))
        return self.outcome

    def rollback(self, reason: str) -> Outcome:
        """Apply nothing, undo grammar staging, log DISCARD; a doomed request then finishes."""
        self._check_open()
        if self.grammar is not None and self._num_accepted:
            self.grammar.rollback(self._num_accepted)
        self._num_accepted = 0
        self.state.discards.append(reason)
        self._entries.append(Entry(Kind.DISCARD, self.state.rid, {"reason": reason}))
        self.outcome = Outcome.DISCARDED
        if self.state.is_doomed:
            self.state.finish_reason, self.state.finish_matched = FinishReason.ABORT, None
            self._entries.append(finish_entry(self.state))
        return self.outcome
