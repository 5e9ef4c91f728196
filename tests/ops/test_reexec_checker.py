"""The result checker alone: the logged values replace the recomputed ones before the runner
publishes them, so every later input (and KV entry) is the logged one, and the first difference
is the one reported."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from commitlog import Entry, Kind
from commitlog.codec import Record
from ops.reexec.checker import ResultChecker
from ops.reexec.compare import Finding, Status, Tolerance
from server.forward_batch import BatchResult


def _commit(payload: dict[str, Any]) -> Record:
    entry = Entry(Kind.COMMIT, "a", {"ids": [], "lp": [], "top": [], "ilp": [], **payload})
    return Record(9, entry.kind, 0, entry.rid, entry.payload, b"", b"")


def _run(isolated: bool, token: int, lp: float, greedy: bool = True) -> tuple[BatchResult, Finding]:
    req = SimpleNamespace(scheduled_tokens=3, params=SimpleNamespace(is_greedy=greedy),
                          logprob=SimpleNamespace(return_hidden_states=False))
    batch = SimpleNamespace(reqs=[req], samples=[True], input_logprob_targets=[[]])
    result = BatchResult([token], [lp], [[token, 2]], [[lp, -3.0]], [], [], [], torch.zeros(0, 4))
    checker = ResultChecker(Tolerance(isolated))
    finding = Finding("a", 1)
    checker.findings = {1: finding}
    checker.expect([1], [_commit({"ids": [5], "lp": [-0.5], "top": [[[5, -0.5], [2, -3.0]]]})])
    checker(batch, result)  # type: ignore[arg-type]
    return result, finding


def test_logged_token_and_logprobs_replace_the_recomputed_ones() -> None:
    result, finding = _run(isolated=False, token=7, lp=-0.25)
    assert result.next_token_ids == [5] and result.next_token_logprobs == [-0.5]
    assert result.top_ids[0] == [5, 2] and result.top_logprobs[0] == [-0.5, -3.0]
    assert finding.status is Status.DIVERGED
    assert (finding.divergence.position, finding.divergence.what) == (2, "token")  # type: ignore[union-attr]


def test_equal_values_are_proven_bit_for_bit() -> None:
    _, finding = _run(isolated=False, token=5, lp=-0.5)
    assert finding.status is Status.PROVEN and (finding.tokens_checked, finding.logprobs_checked) == (1, 1)


def test_isolated_greedy_near_tie_is_named_not_a_divergence() -> None:
    result, finding = _run(isolated=True, token=7, lp=-0.5 + 1e-6)
    assert finding.status is Status.PROVEN and finding.ties == [2]
    assert result.next_token_ids == [5]


def test_isolated_sampled_token_mismatch_is_a_divergence() -> None:
    _, finding = _run(isolated=True, token=7, lp=-0.5 + 1e-6, greedy=False)
    assert finding.status is Status.DIVERGED
