"""SGLang-shaped result dicts, built from a finished request's committed view.

The offline Engine builds the view from the request's committed state; the HTTP front
builds it from the durable deltas it received. Both format through `format_output`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commitlog.audit import finish_reason_object
from server.finish import shown_text
from server.outputs import RequestDelta
from server.request import LogprobRequest, Req, RequestSpec
from server.tokenizer import Tokenizer


@dataclass(slots=True)
class CommittedView:
    rid: str
    prompt_ids: list[int]
    logprob: LogprobRequest
    skip_special_tokens: bool = True
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    hidden_states: list[list[float]] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    e2e_latency: float = 0.0
    reasoning_tokens: int = 0  # the first `reasoning_tokens` output ids are reasoning (thinking)
    cached_tokens: int = 0  # prompt tokens whose KV the prefix cache supplied (as logged)
    no_stop_trim: bool = False  # keep a matched stop string in the text (SGLang's no_stop_trim)
    spaces_between_special_tokens: bool = True

    @classmethod
    def for_spec(cls, spec: RequestSpec) -> CommittedView:
        """An empty view that the front fills from the request's durable deltas."""
        p = spec.params
        return cls(spec.rid, spec.prompt_ids, spec.logprob, p.skip_special_tokens, no_stop_trim=p.no_stop_trim,
                   spaces_between_special_tokens=p.spaces_between_special_tokens)

    @classmethod
    def of(cls, req: Req) -> CommittedView:
        s = req.state
        hidden = [np.frombuffer(b, dtype=np.float32).tolist() for b in s.hidden_states]
        return cls(req.rid, req.prompt_ids, req.logprob, req.params.skip_special_tokens, list(s.output_ids),
                   list(s.output_logprobs), [list(t) for t in s.output_top_logprobs], list(s.input_logprobs),
                   [list(t) for t in s.input_top_logprobs], hidden, finish_reason_object(s),
                   (req.finish_time or req.arrival_time) - req.arrival_time, s.num_reasoning_tokens, s.cached_tokens,
                   req.params.no_stop_trim, req.params.spaces_between_special_tokens)

    def apply(self, delta: RequestDelta) -> None:
        self.output_ids.extend(delta.token_ids)
        self.output_logprobs.extend(delta.logprobs)
        self.output_top_logprobs.extend([[(int(t), float(lp)) for t, lp in top] for top in delta.top_logprobs])
        self.input_logprobs.extend(delta.input_logprobs)
        self.input_top_logprobs.extend([[(int(t), float(lp)) for t, lp in top] for top in delta.input_top_logprobs])
        self.hidden_states.extend(delta.hidden_states)
        self.reasoning_tokens = max(self.reasoning_tokens, delta.reasoning_tokens)
        self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)
        if delta.finish is not None:
            self.finish = delta.finish

    def text(self, tokenizer: Tokenizer, start: int = 0) -> str:
        """The output text from output token `start` on, trimmed as the client is shown it."""
        def decode(ids: Sequence[int]) -> str:
            return tokenizer.decode(ids, self.skip_special_tokens, self.spaces_between_special_tokens)

        return shown_text(self.output_ids[start:], decode, self.finish, self.no_stop_trim)

    def reasoning_text(self, tokenizer: Tokenizer) -> str:
        """The reasoning (thinking) part, without its <think> markers."""
        return tokenizer.decode(self.output_ids[: self.reasoning_tokens], skip_special_tokens=True).strip()


def format_output(view: CommittedView, tokenizer: Tokenizer) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": view.rid,
        "finish_reason": view.finish,
        "prompt_tokens": len(view.prompt_ids),
        "completion_tokens": len(view.output_ids),
        "cached_tokens": view.cached_tokens,
        "reasoning_tokens": view.reasoning_tokens,
        "e2e_latency": view.e2e_latency,
    }
    if view.logprob.return_logprob:
        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(view.output_logprobs, view.output_ids)]
        # SGLang's count of output logprobs so far: a streaming client checks its chunks against it.
        meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
        if view.logprob.top_logprobs_num > 0:  # as SGLang: only when top logprobs were asked for
            meta["output_top_logprobs"] = [[(lp, t, None) for t, lp in top] for top in view.output_top_logprobs]
        if view.logprob.logprob_start_len >= 0:
            meta["input_token_logprobs"] = _input_logprobs(view)
            meta["input_top_logprobs"] = _input_top_logprobs(view)
    if view.logprob.return_hidden_states:
        meta["hidden_states"] = view.hidden_states
    return {"text": view.text(tokenizer), "output_ids": list(view.output_ids), "meta_info": meta}


def _input_logprobs(view: CommittedView) -> list[tuple[float | None, int, None]]:
    # Position 0 has no preceding context; like SGLang it is reported as None.
    start = view.logprob.logprob_start_len
    first = [(None, view.prompt_ids[0], None)] if start == 0 else []
    scored = range(max(start, 1), len(view.prompt_ids))
    return first + [(lp, view.prompt_ids[p], None) for p, lp in zip(scored, view.input_logprobs)]


def _input_top_logprobs(view: CommittedView) -> list[list[tuple[float, int, None]] | None]:
    """One list per prompt position from logprob_start_len, as SGLang shapes it: position 0 (no
    context) is None; empty when no top_logprobs_num was asked for."""
    if not view.logprob.top_logprobs_num:
        return []
    first: list[list[tuple[float, int, None]] | None] = [None] if view.logprob.logprob_start_len == 0 else []
    return first + [[(lp, t, None) for t, lp in top] for top in view.input_top_logprobs]
