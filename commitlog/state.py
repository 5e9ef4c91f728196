"""Per-request state, and the functions that advance it from a commit or a record.

A committed transaction and a replayed COMMIT record both go through `apply_delta`, so the
live path and the rebuild path cannot drift apart (I6).
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from commitlog.codec import Entry, Kind, Payload, Record

TopLogprobs = list[tuple[int, float]]


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    INTERRUPTED = "interrupted"


class DoomSource(enum.Enum):
    API = "api"
    DISCONNECT = "disconnect"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"


@dataclass(slots=True)
class RequestState:
    """Everything the log knows about one request. Hidden states are opaque bytes."""

    rid: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    grammar_spec: str | None = None
    arrival_ns: int = 0
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    input_top_logprobs: list[TopLogprobs] = field(default_factory=list)  # per scored prompt position, if asked
    hidden_states: list[bytes] = field(default_factory=list)
    num_grammar_tokens: int = 0
    num_reasoning_tokens: int = 0
    is_reasoning_ended: bool = False
    kv_committed_len: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (first COMMIT's `pc`)
    finish_reason: FinishReason | None = None
    finish_matched: int | str | None = None
    doom_reason: str | None = None
    doom_source: DoomSource | None = None
    abort_time_ns: int | None = None
    num_commits: int = 0
    discards: list[str] = field(default_factory=list)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def is_doomed(self) -> bool:
        return self.doom_reason is not None


@dataclass(slots=True)
class Delta:
    """The mutations one committed transaction applies; its payload is the COMMIT body."""

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    hidden_states: list[bytes] = field(default_factory=list)
    num_grammar_tokens: int = 0
    num_reasoning_tokens: int = 0
    is_reasoning_ended: bool = False
    kv_committed_len: int | None = None
    finish_reason: FinishReason | None = None
    finish_matched: int | str | None = None
    cached_tokens: int = 0  # only on a request's first COMMIT, and only when its prefix was cached
    input_top_logprobs: list[TopLogprobs] = field(default_factory=list)

    def to_payload(self) -> Payload:
        # Built once per request per step: the optional keys are added only when set, and the
        # key order ("pc" first, "itop" last) is the one every COMMIT has been written with.
        fin = None if self.finish_reason is None else [self.finish_reason.value, self.finish_matched]
        top = self.output_top_logprobs
        body: Payload = {
            "ids": self.output_ids, "lp": self.output_logprobs,
            "top": [[list(p) for p in t] for t in top] if top else [],
            "ilp": self.input_logprobs, "hs": self.hidden_states,
            "g": self.num_grammar_tokens, "rc": self.num_reasoning_tokens,
            "re": self.is_reasoning_ended, "wm": self.kv_committed_len, "fin": fin,
        }
        if self.input_top_logprobs:  # only when asked for (top_logprobs_num with prompt logprobs)
            body["itop"] = [[list(p) for p in t] for t in self.input_top_logprobs]
        return {"pc": self.cached_tokens, **body} if self.cached_tokens else body

    @classmethod
    def from_payload(cls, p: Payload) -> Delta:
        fin = p["fin"]
        return cls(
            list(p["ids"]), list(p["lp"]), [[(int(i), lp) for i, lp in top] for top in p["top"]],
            list(p["ilp"]), list(p["hs"]), p["g"], p["rc"], p["re"], p["wm"],
            None if fin is None else FinishReason(fin[0]), None if fin is None else fin[1], p.get("pc", 0),
            [[(int(i), lp) for i, lp in top] for top in p.get("itop", ())],
        )


def begin_entry(state: RequestState) -> Entry:
    return Entry(Kind.BEGIN, state.rid, {
        "prompt": state.prompt_ids, "params": state.sampling_params,
        "grammar": state.grammar_spec, "arrival": state.arrival_ns,
    })


def finish_entry(state: RequestState) -> Entry:
    assert state.finish_reason is not None
    return Entry(Kind.FINISH, state.rid, {
        "reason": state.finish_reason.value, "matched": state.finish_matched,
        "n_out": len(state.output_ids), "kv": state.kv_committed_len,
    })


def apply_delta(state: RequestState, delta: Delta) -> None:
    state.output_ids.extend(delta.output_ids)
    state.output_logprobs.extend(delta.output_logprobs)
    state.output_top_logprobs.extend(delta.output_top_logprobs)
    state.input_logprobs.extend(delta.input_logprobs)
    state.input_top_logprobs.extend(delta.input_top_logprobs)
    state.hidden_states.extend(delta.hidden_states)
    state.num_grammar_tokens += delta.num_grammar_tokens
    state.num_reasoning_tokens += delta.num_reasoning_tokens
    state.is_reasoning_ended = state.is_reasoning_ended or delta.is_reasoning_ended
    if delta.kv_committed_len is not None:
        state.kv_committed_len = delta.kv_committed_len
    if delta.cached_tokens:
        state.cached_tokens = delta.cached_tokens
    if delta.finish_reason is not None:
        state.finish_reason, state.finish_matched = delta.finish_reason, delta.finish_matched
    state.num_commits += 1


def state_from_begin(record: Record | Entry) -> RequestState:
    p = record.payload
    assert record.rid is not None
    return RequestState(record.rid, list(p["prompt"]), dict(p["params"]), p["grammar"], p["arrival"])


def apply_record(state: RequestState, record: Record | Entry) -> None:
    """Advance `state` by one non-BEGIN record of its request."""
    p = record.payload
    if record.kind is Kind.COMMIT:
        apply_delta(state, Delta.from_payload(p))
    elif record.kind is Kind.DISCARD:
        state.discards.append(p["reason"])
    elif record.kind is Kind.ABORT_REQUESTED:
        state.doom_reason, state.doom_source = p["reason"], DoomSource(p["source"])
        state.abort_time_ns = p["t"]
    elif record.kind is Kind.FINISH:
        state.finish_reason, state.finish_matched = FinishReason(p["reason"]), p["matched"]


def replay(records: Iterable[Record]) -> RequestState | None:
    """Rebuild one request from its records in LSN order; None if there is no BEGIN."""
    state: RequestState | None = None
    for record in records:
        if record.kind is Kind.BEGIN:
            state = state_from_begin(record)
        elif state is not None:
            apply_record(state, record)
    return state
