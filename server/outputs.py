"""What the scheduler hands to the output side once a step's log group is durable:
one delta per request whose state a committed (or discarded-and-finished) txn changed."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestDelta:
    rid: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # with top_logprobs_num
    hidden_states: list[list[float]] = field(default_factory=list)
    finish: dict[str, Any] | None = None  # SGLang's finish_reason object, once finished
    completion_tokens: int = 0  # committed output length after this delta
    reasoning_tokens: int = 0  # committed reasoning tokens after this delta (--reasoning-parser)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache, as logged


class AbortStatus(str, enum.Enum):
    ABORTED = "aborted"
    ALREADY_FINISHED = "already_finished"
    UNKNOWN = "unknown"
    CORRUPT = "corrupt"  # the log holds the rid, but its records fail their checks


@dataclass(frozen=True, slots=True)
class AbortAnswer:
    """The scheduler's final word on an abort: nothing beyond `completion_tokens` is ever delivered."""

    rid: str
    status: AbortStatus
    completion_tokens: int = 0
    lsn: int | None = None  # the ABORT_REQUESTED record, durable when this answer is sent
    finish: dict[str, Any] | None = None  # for already_finished: how it finished
    detail: str | None = None  # for corrupt: what the check found

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rid": self.rid, "status": self.status.value, "completion_tokens": self.completion_tokens,
                               "lsn": self.lsn}
        if self.finish is not None:
            out["finish_reason"] = self.finish
        if self.detail is not None:
            out["detail"] = self.detail
        return out
