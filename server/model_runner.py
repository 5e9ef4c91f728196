"""Runs `ForwardBatch`es behind a launch → handle interface, with a future-token map.

A decode input whose previous token is not yet known (its result is still pending) is a
placeholder `-(slot + 1)`; `launch` resolves placeholders from the future map, which each
launched forward fills with the tokens it sampled. Launches resolve in launch order, so
the same order is exact on every device.

On CPU the forward runs synchronously inside `launch`; the overlap is in the order of scheduling
vs. result processing, not in threads. On CUDA `launch` only enqueues the forward on one compute
stream (`server.cuda_overlap`) and records an event; `ForwardHandle.result()` waits on that event,
so the host schedules step N+1 while the device runs step N — the real overlap.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.registry import BackendUnavailableError, create_backend
from server.cuda_overlap import ComputeStream
from server.errors import ConfigError
from server.forward_batch import BatchResult, ForwardBatch
from server.memory import TokenToKVPool
from server.models.causal_lm import CausalLM
from server.sampling.sampler import sample


@dataclass(slots=True)
class PendingResult:
    """A forward's outputs as tensors on its device, read back to the host only in `to_host`."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor
    input_logprobs: torch.Tensor
    hidden_states: torch.Tensor

    def to_host(self) -> BatchResult:
        return BatchResult(
            next_token_ids=self.token_ids.tolist(), next_token_logprobs=self.logprobs.tolist(),
            top_ids=self.top_ids.tolist(), top_logprobs=self.top_logprobs.tolist(),
            input_logprobs=self.input_logprobs.tolist(), hidden_states=self.hidden_states.cpu(),
        )


@dataclass(slots=True)
class ForwardHandle:
    """A launched forward. `result()` waits for the device (CUDA) and reads the outputs back once."""

    seq: int
    batch: ForwardBatch
    _pending: PendingResult | None
    _done: torch.cuda.Event | None = None  # None on CPU: the forward already ran
    _result: BatchResult | None = None

    def result(self) -> BatchResult:
        if self._result is None:
            assert self._pending is not None
            if self._done is not None:
                self._done.synchronize()
            self._result, self._pending = self._pending.to_host(), None
        return self._result


class ModelRunner:
    def __init__(self, model: CausalLM, kv_pool: TokenToKVPool, future_slots: int, attention_backend: str = "auto") -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.device = kv_pool.device
        self.scale = model.config.head_dim**-0.5
        try:
            self.attention = create_backend(attention_backend, kv_pool, self.scale)
        except BackendUnavailableError as exc:
            raise ConfigError(str(exc)) from None
        self.future_tokens = torch.zeros(future_slots, dtype=torch.int64, device=self.device)
        self.stream = ComputeStream.for_device(self.device)
        self._launches = 0

    def launch(self, batch: ForwardBatch) -> ForwardHandle:
        self._launches += 1
        if self.stream is None:
            return ForwardHandle(self._launches, batch, self._run(batch))
        with self.stream.enqueue() as done:
            pending = self._run(batch)
        return ForwardHandle(self._launches, batch, pending, done)

    def _run(self, batch: ForwardBatch) -> PendingResult:
        ids = batch.input_ids
        placeholders = ids < 0
        # On a device, asking whether any placeholder is present would wait for the device: resolve always.
        if ids.is_cuda or bool(placeholders.any()):
            ids = torch.where(placeholders, self.future_tokens[(-ids - 1).clamp(min=0)], ids)
        pending = self._forward(batch, ids)
        if batch.future_slots:
            slots = torch.tensor(batch.future_slots, dtype=torch.int64, device=self.device)
            self.future_tokens[slots] = pending.token_ids
        return pending

    @torch.inference_mode()
    def _forward(self, batch: ForwardBatch, input_ids: torch.Tensor) -> PendingResult:
        num_positions = max((p + n for p, n in zip(batch.prefix_lens, batch.extend_lens)), default=0)
        hidden = self.model(input_ids, batch.positions, self.attention.plan(batch.layout), num_positions)
        ends = torch.tensor(batch.extend_lens, device=self.device).cumsum(0)
        sampling = [i for i, s in enumerate(batch.samples) if s]
        if sampling:
            sample_rows = ends[torch.tensor(sampling, device=self.device)] - 1
        else:
            sample_rows = torch.zeros(0, dtype=torch.int64, device=self.device)
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
        hidden_rows = [j for j, i in enumerate(sampling) if batch.reqs[i].logprob.return_hidden_states]
        return PendingResult(
            sampled.token_ids, sampled.logprobs, sampled.top_ids, sampled.top_logprobs,
            self._input_logprobs(batch, hidden), hidden[sample_rows[hidden_rows]].float(),
        )

    def _input_logprobs(self, batch: ForwardBatch, hidden: torch.Tensor) -> torch.Tensor:
        rows: list[int] = []
        targets: list[int] = []
        start = 0
        for i, req in enumerate(batch.reqs):
            for pos in batch.input_logprob_targets[i]:
                # The logit for prompt position `pos` comes from the row of position pos-1.
                rows.append(start + pos - 1 - batch.prefix_lens[i])
                targets.append(req.prompt_ids[pos])
            start += batch.extend_lens[i]
        if not rows:
            return torch.zeros(0)
        logits = self.model.logits(hidden[torch.tensor(rows, device=self.device)])
        logprobs = torch.log_softmax(logits, dim=-1)
        return logprobs.gather(1, torch.tensor(targets, device=self.device)[:, None])[:, 0]
