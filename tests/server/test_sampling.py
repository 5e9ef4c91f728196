"""Sampling: seeded draws reproducible and independent of batch company; filters exact."""
from __future__ import annotations

import random

import pytest
import torch

from server.sampling.params import SamplingParams
from server.sampling.sampler import _filtered_probs, greedy_tokens, sample

PARAMS = {"max_new_tokens": 12, "temperature": 1.0, "seed": 77, "ignore_eos": True}


def test_seeded_sampling_is_reproducible_and_independent_of_batch_company(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    target = list(range(10, 40))
    alone = engine.generate(input_ids=target, sampling_params=PARAMS)["output_ids"]
    again = engine.generate(input_ids=target, sampling_params=PARAMS)["output_ids"]
    others = [list(range(5, 5 + n)) for n in (3, 90, 17)]
    batch = engine.generate(
        input_ids=[others[0], target, others[1], others[2]],
        sampling_params=[{"max_new_tokens": 12, "temperature": 0.7}, PARAMS, {"max_new_tokens": 5}, {"temperature": 0}],
    )
    assert alone == again == batch[1]["output_ids"]
    other_seed = engine.generate(input_ids=target, sampling_params={**PARAMS, "seed": 78})["output_ids"]
    assert other_seed != alone


def test_top_k_one_is_greedy(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = list(range(3, 50))
    greedy = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
    top1 = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 8, "top_k": 1, "seed": 5, "ignore_eos": True})
    assert greedy["output_ids"] == top1["output_ids"]


def test_greedy_rows_take_argmaxs_token_on_ties_nan_and_infinities():
    """The CPU's greedy pick (through `max(dim)`) is argmax's: the first of tied maxima, a NaN above all,
    +inf above any finite logit, and a row of -inf at id 0."""
    gen = torch.Generator().manual_seed(11)
    cases = [torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 5.0, float("nan"), 1.0],
                           [0.0, float("inf"), 1.0, float("inf")], [float("-inf")] * 4])]
    for vocab in (1, 7, 16, 17, 1024, 1031):
        rows = torch.randint(-2, 3, (9, vocab), generator=gen).float()  # few values: many ties
        rows[torch.rand(9, vocab, generator=gen) < 0.02] = float("nan")
        rows[torch.rand(9, vocab, generator=gen) < 0.02] = float("inf")
        cases.append(rows)
    for logits in cases:
        expected = logits.argmax(dim=-1)
        assert torch.equal(greedy_tokens(logits), expected)
        greedy = [SamplingParams(temperature=0.0)] * logits.shape[0]
        out = sample(logits.clone(), greedy, [random.Random(0)] * logits.shape[0], 0)
        assert torch.equal(out.token_ids, expected)
    assert greedy_tokens(cases[0]).tolist() == [1, 0, 1, 0]


def test_filters_keep_exactly_the_allowed_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.8), SamplingParams(min_p=0.25)]
    probs = _filtered_probs(logits, params)
    assert torch.allclose(probs[0], torch.tensor([0.625, 0.375, 0, 0]))
    # top_p=0.8: 0.5 + 0.3 reaches 0.8, so the third token is excluded.
    assert torch.allclose(probs[1], torch.tensor([0.625, 0.375, 0, 0]))
    # min_p=0.25 of the top probability 0.5 keeps tokens with p >= 0.125.
    assert torch.allclose(probs[2], torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)


def test_sampling_draws_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 4000
    logits = torch.log(probs).repeat(n, 1)
    streams = [random.Random(i) for i in range(n)]
    out = sample(logits, [SamplingParams()] * n, streams, top_k_max=0)
    freq = torch.bincount(out.token_ids, minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.03)
    assert torch.allclose(out.logprobs, torch.log(probs)[out.token_ids], atol=1e-6)


def test_an_unfiltered_rows_distribution_is_bitwise_the_same_beside_a_filtered_row():
    """Rows without top-k/top-p/min-p skip the sort; a row's path depends on its own parameters, so a
    seeded request's distribution (and draw) does not change with its batch company."""
    logits = torch.randn(3, 257, generator=torch.Generator().manual_seed(3))
    plain = SamplingParams(temperature=0.8)
    alone = _filtered_probs(logits[:1], [plain])
    beside = _filtered_probs(logits, [plain, SamplingParams(top_p=0.9), SamplingParams(top_k=5)])
    assert torch.equal(alone[0], beside[0])
    assert torch.equal(beside[1], _filtered_probs(logits[1:2], [SamplingParams(top_p=0.9)])[0])
    assert int((beside[2] > 0).sum()) == 5 and torch.allclose(alone.sum(), torch.tensor(1.0))


class _FixedStream(random.Random):
    """A stream whose every uniform is `u`: the inversion's edges, on demand."""

    def __init__(self, u: float) -> None:
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


def test_inversion_at_the_uniforms_edges_draws_only_tokens_with_mass():
    # Top-k 2 leaves mass on tokens 0 and 1 only. Should u * total round up to the total (u = 1 here,
    # the limit of the product's rounding), no bucket holds it: the draw must be the row's last token
    # with mass, never a filtered one and never an index past the vocabulary.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 2))
    params = [SamplingParams(top_k=2), SamplingParams()]
    top = sample(logits, params, [_FixedStream(1.0)] * 2, top_k_max=0).token_ids.tolist()
    assert top == [1, 3]
    bottom = sample(logits, params, [_FixedStream(0.0)] * 2, top_k_max=0).token_ids.tolist()
    assert bottom == [0, 0]
    # u = 0.7 of the top-2 mass falls in token 1's bucket [0.625, 1).
    assert sample(logits[:1], params[:1], [_FixedStream(0.7)], top_k_max=0).token_ids.tolist() == [1]


def test_a_batch_that_reports_no_logprobs_draws_the_same_tokens_without_a_log_softmax(monkeypatch):
    """Logprobs only when asked: with `logprobs=False` (and no top-k) the vocabulary-wide log_softmax is
    skipped, every row (greedy and seeded random alike) draws the token it draws with logprobs on, and
    the unasked logprobs read NaN."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 97, generator=gen)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=0.0),
              SamplingParams(top_k=5, seed=2), SamplingParams(top_p=0.9, seed=3), SamplingParams(temperature=1.3, seed=4)]
    with_lp = sample(logits.clone(), params, [random.Random(i) for i in range(6)], 0)
    calls: list[int] = []
    real = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **k: calls.append(1) or real(*a, **k))
    without = sample(logits.clone(), params, [random.Random(i) for i in range(6)], 0, logprobs=False)
    assert calls == []
    assert torch.equal(without.token_ids, with_lp.token_ids)
    assert torch.isnan(without.logprobs).all() and without.logprobs.shape == (6,)
    assert without.top_ids.shape == (6, 0) and without.top_logprobs.shape == (6, 0)
    # Top-k asked (top_logprobs_num > 0) takes the log_softmax whatever the flag says.
    top = sample(logits.clone(), params, [random.Random(i) for i in range(6)], 2, logprobs=False)
    assert calls and torch.equal(top.token_ids, with_lp.token_ids) and top.top_ids.shape == (6, 2)


def test_the_engine_takes_the_log_softmax_only_for_forwards_where_a_request_reports_logprobs(
        tiny_checkpoint, make_engine, monkeypatch):
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = list(range(3, 30))
    greedy = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    reference = engine.generate(input_ids=prompt, sampling_params=greedy, return_logprob=True)
    calls: list[int] = []
    real = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain = engine.generate(input_ids=prompt, sampling_params=greedy)
    assert calls == [] and plain["output_ids"] == reference["output_ids"]
    # Asked again, in a batch: the log_softmax runs and each logprob is the one reported alone.
    both = engine.generate(input_ids=[prompt, list(range(40, 52))], sampling_params=[greedy, greedy],
                           return_logprob=True)
    assert calls
    assert [lp for lp, _t, _ in both[0]["meta_info"]["output_token_logprobs"]] == pytest.approx(
        [lp for lp, _t, _ in reference["meta_info"]["output_token_logprobs"]], abs=1e-5)
