"""A request as the scheduler sees it: its committed state (owned by the commit log) plus
the scheduling bookkeeping that runs ahead of it while results are pending."""
from __future__ import annotations

import random
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from commitlog import RequestState
from server.grammar.matcher import RequestGrammar
from server.grammar.reasoning import ReasoningParser
from server.sampling.params import SamplingParams

if TYPE_CHECKING:
    from server.radix_cache import TreeNode
    from server.sampling.penalties import TokenCounts


@dataclass(frozen=True, slots=True)
class LogprobRequest:
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1  # input logprobs from this prompt position; -1 = output only
    return_hidden_states: bool = False


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A validated request as it travels from the front to the scheduler (seed always set)."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    logprob: LogprobRequest


@dataclass(eq=False, slots=True)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    logprob: LogprobRequest
    rng: random.Random  # the request's own sampling stream (server.sampling.sampler)
    arrival_time: float = field(default_factory=time.monotonic)
    # The committed state; set when the scheduler logs BEGIN. Only transactions mutate it.
    state: RequestState = field(init=False)
    # KV bookkeeping: slots written into the request's row (ahead of the committed watermark).
    pool_row: int | None = None
    kv_allocated_len: int = 0
    reserved_tokens: int = 0
    # Prefix cache: the row's first `owned_len` slots are the tree's, locked by `cache_node`;
    # `cached_len` of them were matched at admission (reused, not computed: what is reported).
    cached_len: int = 0
    owned_len: int = 0
    cache_node: TreeNode | None = None
    # Scheduling side, ahead of the committed state while results are pending (overlap).
    scheduled_prefill_len: int = 0  # prompt tokens put into launched batches
    inflight_tokens: int = 0  # tokens sampled by launched forwards whose results are pending
    inflight_batches: int = 0
    future_slot: int = -1  # where the latest in-flight token is published
    finish_time: float | None = None
    abort_lsn: int | None = None
    # Structured output: the compile in flight (not admitted until done), then the matcher.
    grammar_future: Future[Any] | None = None
    grammar: RequestGrammar | None = None
    reasoning: ReasoningParser | None = None  # the server's parser; None: no reasoning tracked
    # Penalties' committed token counts, made at the request's first sampling forward; only a
    # committed transaction adds to them (None: the request has no penalties).
    counts: TokenCounts | None = None
    # Read for every sampled row at every step (the sampler's zero-cost check): computed once.
    adjusts_logits: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.adjusts_logits = self.params.adjusts_logits

    @classmethod
    def from_spec(cls, spec: RequestSpec) -> Req:
        assert spec.params.seed is not None, "the front assigns every request a seed"
        return cls(spec.rid, spec.prompt_ids, spec.params, spec.logprob, random.Random(spec.params.seed))

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.state.output_ids

    @property
    def is_finished(self) -> bool:
        return self.state.is_finished

    @property
    def is_doomed(self) -> bool:
        return self.state.is_doomed

    @property
    def scheduled_tokens(self) -> int:
        """Output tokens committed or already being produced by a launched forward."""
        return len(self.state.output_ids) + self.inflight_tokens

    @property
    def is_grammar_active(self) -> bool:
        """Is the next token masked? A reasoning request is unconstrained until its thinking ends."""
        return self.grammar is not None and (self.reasoning is None or not self.reasoning.is_reasoning(self.state))

    @property
    def reads_committed_history(self) -> bool:
        """Does its next sampling read state only a commit advances (grammar matcher, penalty counts)?
        Such a request never decodes while a token of it is pending."""
        return self.grammar is not None or self.params.has_penalties

    @property
    def wants_input_logprobs(self) -> bool:
        return self.logprob.return_logprob and self.logprob.logprob_start_len >= 0

    def begin_params(self) -> dict[str, object]:
        """What BEGIN records: every parameter that shapes the output, the effective seed included."""
        p = self.params
        return {
            "max_new_tokens": p.max_new_tokens, "temperature": p.temperature, "top_p": p.top_p,
            "top_k": p.top_k, "min_p": p.min_p, "stop": list(p.stop), "stop_token_ids": list(p.stop_token_ids),
            "ignore_eos": p.ignore_eos, "seed": p.seed, "return_logprob": self.logprob.return_logprob,
            "top_logprobs_num": self.logprob.top_logprobs_num, "logprob_start_len": self.logprob.logprob_start_len,
            "return_hidden_states": self.logprob.return_hidden_states, **self._control_params(),
        }

    def _control_params(self) -> dict[str, object]:
        """The sampling controls a request set away from neutral (kept out of BEGIN otherwise)."""
        p = self.params
        values: dict[str, object] = {
            "min_new_tokens": p.min_new_tokens, "frequency_penalty": p.frequency_penalty,
            "presence_penalty": p.presence_penalty, "repetition_penalty": p.repetition_penalty,
            "logit_bias": [list(pair) for pair in p.logit_bias], "no_stop_trim": p.no_stop_trim,
            "skip_special_tokens": p.skip_special_tokens, "spaces_between_special_tokens": p.spaces_between_special_tokens,
        }
        neutral = SamplingParams()
        return {k: v for k, v in values.items() if v != (list(neutral.logit_bias) if k == "logit_bias" else getattr(neutral, k))}
