"""Compares one forward's recomputed results with the logged COMMITs of its members, then puts the
logged values in their place: the run goes on along the logged path (every later input, KV entry,
grammar state and finish check is the logged one), so one divergence does not hide the next request's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from commitlog import Kind, Record
from ops.reexec.compare import LOGPROB_TOLERANCE, Divergence, Finding, Tolerance
from server.forward_batch import BatchResult, ForwardBatch
from server.request import Req


@dataclass(slots=True)
class _Slot:
    """Where member i's values sit in the packed result."""

    sample: int | None  # index among sampling members
    input_logprobs: slice
    hidden: int | None  # row of the packed hidden states


def _slots(batch: ForwardBatch) -> list[_Slot]:
    slots, sample, ilp, hidden = [], 0, 0, 0
    for i, samples in enumerate(batch.samples):
        n = len(batch.input_logprob_targets[i])
        has_hidden = samples and batch.reqs[i].logprob.return_hidden_states
        slots.append(_Slot(sample if samples else None, slice(ilp, ilp + n), hidden if has_hidden else None))
        sample += int(samples)
        ilp += n
        hidden += int(has_hidden)
    return slots


class ResultChecker:
    def __init__(self, tolerance: Tolerance) -> None:
        self.tolerance = tolerance
        self.findings: dict[int, Finding] = {}  # by BEGIN LSN
        self.outcomes: list[Record | None] = []  # the launching forward's, in the batch's order
        self.keys: list[int] = []  # their BEGIN LSNs

    def expect(self, keys: list[int], outcomes: list[Record | None]) -> None:
        self.keys, self.outcomes = keys, outcomes

    def __call__(self, batch: ForwardBatch, result: BatchResult) -> None:
        for i, (req, slot) in enumerate(zip(batch.reqs, _slots(batch))):
            outcome, finding = self.outcomes[i], self.findings[self.keys[i]]
            if outcome is not None and outcome.kind is Kind.COMMIT:
                self._input_logprobs(finding, batch.input_logprob_targets[i], outcome.payload["ilp"], result, slot)
                if slot.hidden is not None and outcome.payload["hs"]:
                    self._hidden(finding, req.scheduled_tokens - 1, outcome.payload["hs"][0], result, slot.hidden)
                if slot.sample is not None and outcome.payload["ids"]:
                    self._token(finding, req, outcome.payload, result, slot.sample)
            elif outcome is not None and slot.sample is not None:
                finding.discarded_rerun += 1  # run again; the log keeps no token of it to compare

    def _input_logprobs(self, finding: Finding, targets: list[int], logged: Any, result: BatchResult,
                        slot: _Slot) -> None:
        recomputed = result.input_logprobs[slot.input_logprobs]
        for pos, old, new in zip(targets, logged, recomputed):
            finding.logprobs_checked += 1
            if not self.tolerance.equal(old, new):
                finding.diverge(Divergence(pos, "input logprob", old, new))
        result.input_logprobs[slot.input_logprobs] = list(logged)

    def _hidden(self, finding: Finding, position: int, logged: bytes, result: BatchResult, row: int) -> None:
        """Hidden states are logged as float32 bytes: equal bytes, or (--isolated) close values."""
        old = np.frombuffer(logged, dtype=np.float32)
        new = result.hidden_states[row].numpy().astype(np.float32)
        same = old.tobytes() == new.tobytes() or (self.tolerance.isolated and old.shape == new.shape and bool(
            np.allclose(old, new, rtol=LOGPROB_TOLERANCE, atol=LOGPROB_TOLERANCE)))
        if not same:
            finding.diverge(Divergence(position, "hidden state", old[:4].tolist(), new[:4].tolist()))

    def _token(self, finding: Finding, req: Req, logged: Any, result: BatchResult, j: int) -> None:
        position = req.scheduled_tokens - 1  # this forward's token is already counted as scheduled
        token, new_token = int(logged["ids"][0]), result.next_token_ids[j]
        finding.tokens_checked += 1
        if token != new_token:
            self._token_mismatch(finding, req, position, token, new_token, logged, result.next_token_logprobs[j])
        if logged["lp"]:
            old, new = float(logged["lp"][0]), result.next_token_logprobs[j]
            finding.logprobs_checked += 1
            if token == new_token and not self.tolerance.equal(old, new):
                finding.diverge(Divergence(position, "logprob", old, new))
            result.next_token_logprobs[j] = old
        if logged["top"]:
            self._top(finding, position, [tuple(p) for p in logged["top"][0]], result, j)
        result.next_token_ids[j] = token

    def _token_mismatch(self, finding: Finding, req: Req, position: int, token: int, new_token: int,
                        logged: Any, new_lp: float) -> None:
        """--isolated: a greedy pick between two near-equal logits may flip with the batch shape. With the
        logged logprob, that is a tie when the logged token scored within tolerance of the recomputed best."""
        tie = (self.tolerance.isolated and req.params.is_greedy and bool(logged["lp"])
               and self.tolerance.equal(float(logged["lp"][0]), new_lp))
        if tie:
            finding.ties.append(position)
        else:
            finding.diverge(Divergence(position, "token", token, new_token))

    def _top(self, finding: Finding, position: int, logged: list[tuple[int, float]], result: BatchResult, j: int) -> None:
        k = len(logged)
        new = list(zip(result.top_ids[j][:k], result.top_logprobs[j][:k]))
        # Alone (--isolated), near-equal alternatives may swap places: only their values must agree.
        same_ids = self.tolerance.isolated or [i for i, _ in logged] == [i for i, _ in new]
        same = same_ids and len(new) == k and all(self.tolerance.equal(a, b) for (_, a), (_, b) in zip(logged, new))
        if not same and finding.divergence is None:
            finding.diverge(Divergence(position, "top logprobs", logged, new))
        result.top_ids[j][:k] = [i for i, _ in logged]
        result.top_logprobs[j][:k] = [lp for _, lp in logged]
