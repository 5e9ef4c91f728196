"""Runs one `ForwardBatch` through the model and samples: returns a packed `BatchResult`."""
from __future__ import annotations

import torch

from kernels.torch_attention import PagedAttentionMetadata, TorchAttentionContext
from server.forward_batch import BatchResult, ForwardBatch, ForwardMode
from server.memory import TokenToKVPool
from server.models.causal_lm import CausalLM
from server.sampling.sampler import sample


class ModelRunner:
    def __init__(self, model: CausalLM, kv_pool: TokenToKVPool) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.scale = model.config.head_dim**-0.5

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> BatchResult:
        meta = PagedAttentionMetadata(
            is_decode=batch.mode is ForwardMode.DECODE,
            out_cache_loc=batch.out_cache_loc,
            kv_indices=batch.kv_indices,
            extend_lens=batch.extend_lens,
        )
        ctx = TorchAttentionContext(self.kv_pool, meta, self.scale)
        hidden = self.model(batch.input_ids, batch.positions, ctx)
        ends = torch.tensor(batch.extend_lens).cumsum(0)
        sampling = [i for i, s in enumerate(batch.samples) if s]
        sample_rows = (ends[sampling] - 1) if sampling else torch.zeros(0, dtype=torch.int64)
        sampled = sample(
            self.model.logits(hidden[sample_rows]),
            [batch.reqs[i].params for i in sampling],
            [batch.reqs[i].generator for i in sampling],
            batch.top_logprobs_max,
        )
        hidden_rows = [int(sample_rows[j]) for j, i in enumerate(sampling) if batch.reqs[i].logprob.return_hidden_states]
        return BatchResult(
            next_token_ids=sampled.token_ids.tolist(),
            next_token_logprobs=sampled.logprobs.tolist(),
            top_ids=sampled.top_ids.tolist(),
            top_logprobs=sampled.top_logprobs.tolist(),
            input_logprobs=self._input_logprobs(batch, hidden, ends),
            hidden_states=hidden[hidden_rows].float(),
        )

    def _input_logprobs(self, batch: ForwardBatch, hidden: torch.Tensor, ends: torch.Tensor) -> list[float]:
        rows: list[int] = []
        targets: list[int] = []
        for i, req in enumerate(batch.reqs):
            start = int(ends[i]) - batch.extend_lens[i]
            chunk_start = batch.prefix_lens[i]
            for pos in batch.input_logprob_targets[i]:
                # The logit for prompt position `pos` comes from the row of position pos-1.
                rows.append(start + pos - 1 - chunk_start)
                targets.append(req.prompt_ids[pos])
        if not rows:
            return []
        logprobs = torch.log_softmax(self.model.logits(hidden[torch.tensor(rows)]), dim=-1)
        return logprobs.gather(1, torch.tensor(targets)[:, None])[:, 0].tolist()
