"""Runs `ForwardBatch`es behind a launch → handle interface, with a future-token map.

A decode input whose previous token is not yet known (its result is still pending) is a
placeholder `-(slot + 1)`; `launch` resolves placeholders from the future map, which each
launched forward fills with the tokens it sampled. Launches resolve in launch order, so
the same order is exact on every device. On CPU the forward runs synchronously inside
`launch`; the overlap is in the order of scheduling vs. result processing, not in threads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.registry import BackendUnavailableError, create_backend
from server.errors import ConfigError
from server.forward_batch import BatchResult, ForwardBatch
from server.memory import TokenToKVPool
from server.models.causal_lm import CausalLM
from server.sampling.sampler import sample


@dataclass(slots=True)
class ForwardHandle:
    """A launched forward. `result()` is where a device runtime would synchronise."""

    seq: int
    batch: ForwardBatch
    _result: BatchResult

    def result(self) -> BatchResult:
        return self._result


class ModelRunner:
    def __init__(self, model: CausalLM, kv_pool: TokenToKVPool, future_slots: int, attention_backend: str = "auto") -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.scale = model.config.head_dim**-0.5
        try:
            self.attention = create_backend(attention_backend, kv_pool, self.scale)
        except BackendUnavailableError as exc:
            raise ConfigError(str(exc)) from None
        self.future_tokens = torch.zeros(future_slots, dtype=torch.int64)
        self._launches = 0

    def launch(self, batch: ForwardBatch) -> ForwardHandle:
        ids = batch.input_ids
        placeholders = ids < 0
        if bool(placeholders.any()):
            ids = torch.where(placeholders, self.future_tokens[(-ids - 1).clamp(min=0)], ids)
        result = self._forward(batch, ids)
        if batch.future_slots:
            self.future_tokens[torch.tensor(batch.future_slots)] = torch.tensor(result.next_token_ids)
        self._launches += 1
        return ForwardHandle(self._launches, batch, result)

    @torch.inference_mode()
    def _forward(self, batch: ForwardBatch, input_ids: torch.Tensor) -> BatchResult:
        hidden = self.model(input_ids, batch.positions, self.attention.plan(batch.layout))
        ends = torch.tensor(batch.extend_lens).cumsum(0)
        sampling = [i for i, s in enumerate(batch.samples) if s]
        sample_rows = (ends[sampling] - 1) if sampling else torch.zeros(0, dtype=torch.int64)
        logits = self.model.logits(hidden[sample_rows])
        # Constrained requests: their matchers hold every committed token (the scheduler never
        # launches one with a token pending), so the mask is exact for this step.
        grammars = [batch.reqs[i].grammar if batch.reqs[i].is_grammar_active else None for i in sampling]
        if any(g is not None for g in grammars):
            from server.grammar.mask import apply_grammar_masks

            apply_grammar_masks(logits, grammars)
        sampled = sample(
            logits, [batch.reqs[i].params for i in sampling],
            [batch.reqs[i].generator for i in sampling], batch.top_logprobs_max,
        )
        hidden_rows = [int(sample_rows[j]) for j, i in enumerate(sampling) if batch.reqs[i].logprob.return_hidden_states]
        return BatchResult(
            next_token_ids=sampled.token_ids.tolist(), next_token_logprobs=sampled.logprobs.tolist(),
            top_ids=sampled.top_ids.tolist(), top_logprobs=sampled.top_logprobs.tolist(),
            input_logprobs=self._input_logprobs(batch, hidden, ends), hidden_states=hidden[hidden_rows].float(),
        )

    def _input_logprobs(self, batch: ForwardBatch, hidden: torch.Tensor, ends: torch.Tensor) -> list[float]:
        rows: list[int] = []
        targets: list[int] = []
        for i, req in enumerate(batch.reqs):
            start = int(ends[i]) - batch.extend_lens[i]
            for pos in batch.input_logprob_targets[i]:
                # The logit for prompt position `pos` comes from the row of position pos-1.
                rows.append(start + pos - 1 - batch.prefix_lens[i])
                targets.append(req.prompt_ids[pos])
        if not rows:
            return []
        logprobs = torch.log_softmax(self.model.logits(hidden[torch.tensor(rows)]), dim=-1)
        return logprobs.gather(1, torch.tensor(targets)[:, None])[:, 0].tolist()
