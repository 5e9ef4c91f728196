"""Turning `generate(...)` arguments into validated `Req`s (one prompt or a batch)."""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, replace
from typing import Any

from commitlog.rids import rid_problem
from server.errors import InvalidRequestError
from server.request import LogprobRequest, RequestSpec
from server.sampling.params import SamplingParams, check_unicode
from server.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Limits:
    vocab_size: int
    context_len: int
    kv_capacity: int
    max_prompts: int | None = None  # prompts (choices, for OpenAI n > 1) one call may hold; None: no cap


PROMPTS_FLAG = "--max-prompts-per-request"


@dataclass(slots=True)
class GenerateCall:
    """The raw arguments of one `generate` call, before normalisation."""

    prompt: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    return_hidden_states: bool = False
    rid: str | list[str] | None = None


class RequestBuilder:
    def __init__(self, tokenizer: Tokenizer, limits: Limits, random_seed: int) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        # Unseeded requests still get a seed, drawn here, so every request's draws are reproducible.
        self._seeds = random.Random(random_seed)

    def build(self, call: GenerateCall) -> tuple[list[RequestSpec], bool]:
        """Returns the requests and whether the call was a batch."""
        prompts, is_batch = self._prompts(call)
        params = _per_prompt(call.sampling_params, len(prompts), "sampling_params", dict)
        rids = _per_prompt(call.rid, len(prompts), "rid", str)
        for rid in rids:  # the ledger's rule, checked here so a bad rid is a 400, not a scheduler error
            if rid and (problem := rid_problem(rid)) is not None:
                raise InvalidRequestError(problem, "rid")
        logprob = self._logprob_request(call)
        reqs = [self._build_one(p, SamplingParams.from_dict(sp), logprob, rid) for p, sp, rid in zip(prompts, params, rids)]
        if len({r.rid for r in reqs}) != len(reqs):
            raise InvalidRequestError("rids within one batch must be distinct", "rid")
        return reqs, is_batch

    def _prompts(self, call: GenerateCall) -> tuple[list[list[int]], bool]:
        if (call.prompt is None) == (call.input_ids is None):
            raise InvalidRequestError("give exactly one of text (prompt) and input_ids", "text")
        if call.prompt is not None:
            if isinstance(call.prompt, str):
                return [self._encode(call.prompt)], False
            if not isinstance(call.prompt, list) or not call.prompt or not all(isinstance(p, str) for p in call.prompt):
                raise InvalidRequestError("text must be a string or a non-empty list of strings", "text")
            self.check_prompt_count(len(call.prompt), "text")  # before any tokenizing
            return [self._encode(p) for p in call.prompt], True
        ids = call.input_ids
        if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
            self.check_prompt_count(len(ids), "input_ids")
            return [self._check_ids(x) for x in ids], True  # type: ignore[arg-type]
        return [self._check_ids(ids)], False

    def check_prompt_count(self, count: int, field: str) -> None:
        """Bounds the work one call can ask for: refused before a single prompt is built."""
        cap = self.limits.max_prompts
        if cap is not None and count > cap:
            raise InvalidRequestError(f"one request may hold at most {cap} prompts (this one holds {count}); "
                                      f"send several requests, or start the server with a larger {PROMPTS_FLAG}",
                                      field)

    def _encode(self, text: str) -> list[int]:
        check_unicode("text", text)  # the tokenizer raises a bare TypeError on a lone surrogate
        return self.tokenizer.encode(text)

    def _check_ids(self, ids: object) -> list[int]:
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise InvalidRequestError("input_ids must be a list of integers or a list of such lists", "input_ids")
        bad = [t for t in ids if not 0 <= t < self.limits.vocab_size]
        if bad:
            raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary [0, {self.limits.vocab_size})", "input_ids")
        return list(ids)

    def _logprob_request(self, call: GenerateCall) -> LogprobRequest:
        for name in ("return_logprob", "return_hidden_states"):
            if not isinstance(getattr(call, name), bool):
                raise InvalidRequestError(f"{name} must be a boolean", name)
        k = call.top_logprobs_num
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= self.limits.vocab_size:
            raise InvalidRequestError(f"top_logprobs_num must be an integer in [0, {self.limits.vocab_size}]", "top_logprobs_num")
        start = call.logprob_start_len
        if isinstance(start, bool) or not isinstance(start, int) or start < -1:
            raise InvalidRequestError("logprob_start_len must be an integer >= -1", "logprob_start_len")
        return LogprobRequest(call.return_logprob, k, start, call.return_hidden_states)

    def _build_one(self, prompt: list[int], params: SamplingParams, logprob: LogprobRequest, rid: str | None) -> RequestSpec:
        if not prompt:
            raise InvalidRequestError("the prompt is empty", "text")
        need = len(prompt) + params.max_new_tokens
        if need > self.limits.context_len:
            raise InvalidRequestError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                f"context length {self.limits.context_len}", "max_new_tokens")
        if need > self.limits.kv_capacity:
            raise InvalidRequestError(
                f"prompt + max_new_tokens ({need}) exceeds the KV capacity {self.limits.kv_capacity}", "max_new_tokens")
        bad_bias = [t for t, _ in params.logit_bias if t >= self.limits.vocab_size]
        if bad_bias:
            raise InvalidRequestError(f"logit_bias token id {bad_bias[0]} is outside the vocabulary "
                                      f"[0, {self.limits.vocab_size})", "logit_bias")
        if logprob.logprob_start_len >= len(prompt):
            raise InvalidRequestError("logprob_start_len must be below the prompt length", "logprob_start_len")
        if params.seed is None:
            params = replace(params, seed=self._seeds.getrandbits(63))
        return RequestSpec(rid or uuid.uuid4().hex, prompt, params, logprob)


def _per_prompt(value: Any, n: int, name: str, item_type: type) -> list[Any]:
    if value is None or isinstance(value, item_type):
        return [value] * n if item_type is dict or value is None or n == 1 else _too_few(name)
    if isinstance(value, list) and len(value) == n and all(isinstance(v, item_type) for v in value):
        return value
    raise InvalidRequestError(f"{name} must be one {item_type.__name__} or a list with one per prompt", name)


def _too_few(name: str) -> list[Any]:
    raise InvalidRequestError(f"a batch needs one {name} per prompt", name)
