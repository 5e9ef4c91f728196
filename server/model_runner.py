"""Runs `ForwardBatch`es behind a launch → handle interface, with a future-token map.

A decode input whose previous token is not yet known (its result is still pending) is a
placeholder `-(slot + 1)`; `launch` resolves placeholders from the future map, which each
launched forward fills with the tokens it sampled. Launches resolve in launch order, so
the same order is exact on every device.

On CPU the forward runs synchronously inside `launch`; the overlap is in the order of scheduling
vs. result processing, not in threads. On CUDA `launch` only enqueues the forward on one compute
stream (`server.cuda_overlap`) and records an event; `ForwardHandle.result()` waits on that event,
so the host schedules step N+1 while the device runs step N — the real overlap.

On CPU a forward that prefills (extend, mixed) may run on another thread count than a decode
(`prefill_threads`, default the decode's): under `serve` the decode leaves a core to the front. Measured,
that core is busy during prefill steps too (docs/benchmarks.md, fifteenth session), so it is opt-in. A
decode of few rows may run on one thread (`small_decode_rows`, opt-in): where its matmuls are too small to split.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch

from kernels.registry import BackendUnavailableError, create_backend
from server.cuda_overlap import ComputeStream
from server.errors import ConfigError
from server.forward_batch import BatchResult, ForwardBatch, ForwardMode
from server.memory import TokenToKVPool
from server.models.causal_lm import CausalLM
from server.sampling.penalties import AdjustRow, TokenCounts, adjust_logits
from server.sampling.sampler import sample

INPUT_LOGPROB_ROWS = 256  # prompt positions scored per log_softmax: bounds memory at 256 x vocab floats


@dataclass(slots=True)
class PendingResult:
    """A forward's outputs as tensors on its device, read back to the host only in `to_host`."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor
    inputs: InputLogprobs  # prompt logprobs, already on the host (only computed when asked for)
    hidden_states: torch.Tensor

    def to_host(self) -> BatchResult:
        return BatchResult(
            next_token_ids=self.token_ids.tolist(), next_token_logprobs=self.logprobs.tolist(),
            top_ids=self.top_ids.tolist(), top_logprobs=self.top_logprobs.tolist(),
            input_logprobs=self.inputs.logprobs, input_top_ids=self.inputs.top_ids,
            input_top_logprobs=self.inputs.top_logprobs, hidden_states=self.hidden_states.cpu(),
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
    def __init__(self, model: CausalLM, kv_pool: TokenToKVPool, future_slots: int, attention_backend: str = "auto",
                 eos_ids: frozenset[int] = frozenset(), prefill_threads: int | None = None,
                 small_decode_rows: int = 0) -> None:
        self.model = model
        # None: every forward runs on the process's torch thread count. Only a CPU forward's threads matter.
        self.prefill_threads = prefill_threads if kv_pool.device.type == "cpu" else None
        # A decode of at most this many rows runs on one thread (CPU only; 0: none does).
        self.small_decode_rows = small_decode_rows if kv_pool.device.type == "cpu" else 0
        self.eos_ids = eos_ids  # masked, with stop_token_ids, until a request's min_new_tokens are out
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
            threads = self.cpu_threads_for(batch)
            if threads is not None:
                with torch_threads(threads):
                    return ForwardHandle(self._launches, batch, self._run(batch))
            return ForwardHandle(self._launches, batch, self._run(batch))
        with self.stream.enqueue() as done:
            pending = self._run(batch)
        return ForwardHandle(self._launches, batch, pending, done)

    def thread_counts(self) -> set[int]:
        """Every torch thread count a forward of this runner may run on (each needs its compiled graphs)."""
        counts = {torch.get_num_threads()}
        if self.prefill_threads is not None:
            counts.add(self.prefill_threads)
        if self.small_decode_rows:
            counts.add(1)
        return counts

    def cpu_threads_for(self, batch: ForwardBatch) -> int | None:
        """The thread count a CPU forward of `batch` runs on; None: the process's."""
        if batch.mode is not ForwardMode.DECODE:
            return self.prefill_threads
        return 1 if len(batch.reqs) <= self.small_decode_rows else None

    def _run(self, batch: ForwardBatch) -> PendingResult:
        ids = batch.input_ids
        # The builder counted the placeholders on the host: no question to the tensor (on a device, one
        # would wait for it), and one lookup when every input is one (a decode behind its last step).
        if batch.num_placeholders == ids.numel():
            ids = self.future_tokens[torch.rsub(ids, -1)]
        elif batch.num_placeholders:
            placeholders = ids < 0
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
        sampling = [i for i, s in enumerate(batch.samples) if s]
        if batch.mode is ForwardMode.DECODE:
            sampled_hidden = hidden  # one row per request, each sampled: the rows already are the sampled ones
        elif sampling:
            ends = torch.tensor(batch.extend_lens, device=self.device).cumsum(0)
            sampled_hidden = hidden[ends[torch.tensor(sampling, device=self.device)] - 1]
        else:
            sampled_hidden = hidden[:0]
        logits = self.model.logits(sampled_hidden)
        # Constrained requests: their matchers hold every committed token (the scheduler never
        # launches one with a token pending), so the mask is exact for this step.
        grammars = [batch.reqs[i].grammar if batch.reqs[i].is_grammar_active else None for i in sampling]
        if any(g is not None for g in grammars):
            from server.grammar.mask import apply_grammar_masks

            apply_grammar_masks(logits, grammars)
        params = [batch.reqs[i].params for i in sampling]
        adjust = None
        if any(batch.reqs[i].adjusts_logits for i in sampling):  # the zero-cost path: one flag per row
            adjust = partial(adjust_logits, rows=self._adjust_rows(batch, sampling, logits),
                             eos_ids=self.eos_ids)
        sampled = sample(logits, params, [batch.reqs[i].rng for i in sampling], batch.top_logprobs_max,
                         adjust, logprobs=any(batch.reqs[i].logprob.return_logprob for i in sampling))
        hidden_rows = [j for j, i in enumerate(sampling) if batch.reqs[i].logprob.return_hidden_states]
        return PendingResult(
            sampled.token_ids, sampled.logprobs, sampled.top_ids, sampled.top_logprobs,
            self._input_logprobs(batch, hidden), sampled_hidden[hidden_rows].float(),
        )

    def _adjust_rows(self, batch: ForwardBatch, sampling: list[int], logits: torch.Tensor) -> list[AdjustRow]:
        rows = []
        for i in sampling:
            req = batch.reqs[i]
            # The sampled row's position (its segment's last, prefix + new - 1) says how many output
            # tokens precede the one sampled here.
            num_outputs = batch.prefix_lens[i] + batch.extend_lens[i] - req.prompt_len
            if req.params.has_penalties and req.counts is None:
                # Built from committed state only; from here on only a commit adds to it.
                req.counts = TokenCounts(req.prompt_ids, req.output_ids, logits.device)
            if req.counts is not None:
                # The scheduler never launches a penalized request with a token pending, so its
                # committed counts are exactly its history (as for a grammar's matcher).
                assert req.counts.num_tokens == num_outputs, f"{req.rid}: penalty counts out of step"
            rows.append(AdjustRow(req.params, req.counts, num_outputs))
        return rows

    def _input_logprobs(self, batch: ForwardBatch, hidden: torch.Tensor) -> InputLogprobs:
        """Prompt logprobs for the positions requests asked for (only those: nothing is computed
        for a batch where no request asked). A chunk scores its own positions and, through its
        last row, the first position of the next chunk; `input_logprob_targets` says which."""
        rows: list[int] = []
        targets: list[int] = []
        start = 0
        for i, req in enumerate(batch.reqs):
            for pos in batch.input_logprob_targets[i]:
                # The logit for prompt position `pos` comes from the row of position pos-1.
                rows.append(start + pos - 1 - batch.prefix_lens[i])
                targets.append(req.prompt_ids[pos])
            start += batch.extend_lens[i]
        out = InputLogprobs()
        k = batch.input_top_logprobs_max
        # In blocks of rows: a whole chunk's [rows, vocab] fp32 logits at once would be gigabytes.
        for lo in range(0, len(rows), INPUT_LOGPROB_ROWS):
            block = torch.tensor(rows[lo : lo + INPUT_LOGPROB_ROWS], device=self.device)
            logprobs = torch.log_softmax(self.model.logits(hidden[block]).float(), dim=-1)
            wanted = torch.tensor(targets[lo : lo + INPUT_LOGPROB_ROWS], device=self.device)[:, None]
            out.logprobs.extend(logprobs.gather(1, wanted)[:, 0].tolist())
            top_vals, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], wanted[:, :0])
            out.top_ids.extend(top_ids.tolist())
            out.top_logprobs.extend(top_vals.tolist())
        return out


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's (and so the attention kernel's and inductor's) thread count is `n` inside. The compiled trunk
    is specialised on it (dynamo guards the count), so every count used has its graphs compiled at warm-up."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(slots=True)
class InputLogprobs:
    """Packed over every request's targets, in batch order: one value and one top-k list per target."""

    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
