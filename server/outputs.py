"""What the scheduler hands back after each step: one delta per request it advanced."""
from __future__ import annotations

from dataclasses import dataclass, field

from server.request import FinishReason


@dataclass(slots=True)
class RequestDelta:
    rid: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    hidden_states: list[list[float]] = field(default_factory=list)
    finish: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
