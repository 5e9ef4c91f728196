"""Reasoning parsers (`--reasoning-parser`): which output tokens are the model's thinking.

`deepseek-r1`: the chat template opens `<think>`, so output starts inside reasoning and it
ends at `</think>`. `qwen3`: reasoning happens only if the output starts with `<think>`.
The reasoning count includes the markers; it is staged in each result's transaction.
A grammar constrains only the answer: it applies once reasoning is over. Under `qwen3` the
first token is constrained, so a constrained request answers without thinking.
"""
from __future__ import annotations

from dataclasses import dataclass

from commitlog import RequestState
from server.errors import ConfigError

THINK_START, THINK_END = "<think>", "</think>"
# name -> does the output start inside reasoning?
PARSERS = {"deepseek-r1": True, "qwen3": False}


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    name: str
    start_id: int
    end_id: int
    starts_in_reasoning: bool

    @classmethod
    def create(cls, name: str, start_id: int | None, end_id: int | None) -> ReasoningParser:
        if name not in PARSERS:
            raise ConfigError(f"--reasoning-parser must be one of {', '.join(PARSERS)}, got {name!r}")
        if start_id is None or end_id is None:
            raise ConfigError(f"--reasoning-parser {name} needs {THINK_START} and {THINK_END} in the tokenizer's vocabulary")
        return cls(name, start_id, end_id, PARSERS[name])

    def is_reasoning(self, state: RequestState) -> bool:
        """Is the next token part of the reasoning? (Under `qwen3`, the first token decides.)"""
        return not state.is_reasoning_ended and (self.starts_in_reasoning or bool(state.output_ids))

    def step(self, state: RequestState, token: int) -> tuple[int, bool] | None:
        """What staging `token` does to the reasoning state: (tokens to count, ended), or None."""
        if state.is_reasoning_ended:
            return None
        if not state.output_ids and not self.starts_in_reasoning:
            return (1, False) if token == self.start_id else (0, True)
        return 1, token == self.end_id
