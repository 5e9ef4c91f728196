"""A request's scheduling state: its tokens, KV bookkeeping, outputs and finish."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from server.sampling.params import SamplingParams


class FinishKind(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class FinishReason:
    kind: FinishKind
    matched: int | str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind.value}
        if self.kind is FinishKind.STOP:
            out["matched"] = self.matched
        elif self.kind is FinishKind.LENGTH:
            out["length"] = self.matched
        if self.message:
            out["message"] = self.message
        return out


@dataclass(frozen=True, slots=True)
class LogprobRequest:
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # input logprobs from this prompt position; -1 = output only
    return_hidden_states: bool = False


@dataclass(eq=False, slots=True)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    logprob: LogprobRequest
    generator: torch.Generator
    arrival_time: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    hidden_states: list[list[float]] = field(default_factory=list)
    # KV bookkeeping: slots written into the row vs. tokens whose KV is committed.
    pool_row: int | None = None
    kv_allocated_len: int = 0
    kv_committed_len: int = 0
    prefilled_len: int = 0  # prompt tokens whose extend result was processed
    reserved_tokens: int = 0
    # Scheduling side, ahead of the committed state while results are pending (overlap).
    scheduled_prefill_len: int = 0  # prompt tokens put into launched batches
    inflight_tokens: int = 0  # tokens sampled by launched forwards whose results are pending
    inflight_batches: int = 0
    future_slot: int = -1  # where the latest in-flight token is published
    finish: FinishReason | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def total_len(self) -> int:
        return self.prompt_len + len(self.output_ids)

    @property
    def is_prefill_done(self) -> bool:
        return self.prefilled_len >= self.prompt_len

    @property
    def scheduled_tokens(self) -> int:
        """Output tokens committed or already being produced by a launched forward."""
        return len(self.output_ids) + self.inflight_tokens

    @property
    def is_finished(self) -> bool:
        return self.finish is not None

    @property
    def wants_input_logprobs(self) -> bool:
        return self.logprob.return_logprob and self.logprob.logprob_start_len >= 0
