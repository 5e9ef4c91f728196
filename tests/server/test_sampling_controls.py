"""Sampling controls: penalties as HF/vLLM/OpenAI define them, logit_bias, min_new_tokens, and the
penalty counts staged in the transaction (a discarded result leaves them untouched)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from scripted import ScriptedRuntime
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from commitlog import FinishReason, Kind
from server.errors import InvalidRequestError
from server.sampling.params import SamplingParams
from server.sampling.penalties import AdjustRow, TokenCounts, adjust_logits

VOCAB = 64
MAX_NEW = 12


def _prompt(n: int, seed: int, vocab: int = 500) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams) -> torch.Tensor:
    """HF's repetition processor over prompt+output, then OpenAI's frequency/presence over output."""
    ref = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(torch.tensor([prompt + output]), logits[None].clone())[0]
    for token in set(output):
        ref[token] -= p.frequency_penalty * output.count(token) + p.presence_penalty
    for token, bias in p.logit_bias:
        ref[token] += bias
    return ref


def test_penalties_and_bias_match_hf_and_openai_definitions_row_by_row():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=g) * 3
    cases = [  # (prompt, output, params); the middle row asks for nothing and must come back untouched
        (_prompt(9, 1, VOCAB), _prompt(7, 2, VOCAB),
         SamplingParams(repetition_penalty=1.7, frequency_penalty=0.6, presence_penalty=-0.4, logit_bias=((5, 2.5),))),
        (_prompt(4, 3, VOCAB), [], SamplingParams()),
        (_prompt(5, 4, VOCAB), _prompt(11, 5, VOCAB) + [7, 7, 7], SamplingParams(repetition_penalty=0.8, frequency_penalty=-1.2)),
    ]
    rows = [AdjustRow(p, TokenCounts(pr, out) if p.has_penalties else None, len(out)) for pr, out, p in cases]
    got = logits.clone()
    adjust_logits(got, rows, frozenset())
    for i, (prompt, output, params) in enumerate(cases):
        torch.testing.assert_close(got[i], _reference(logits[i], prompt, output, params), rtol=0, atol=1e-6)
    assert torch.equal(got[1], logits[1])


def test_min_new_tokens_masks_eos_and_stop_ids_only_until_reached():
    logits = torch.zeros(2, VOCAB)
    params = SamplingParams(min_new_tokens=3, stop_token_ids=(9,))
    rows = [AdjustRow(params, None, 2), AdjustRow(params, None, 3)]
    got = logits.clone()
    adjust_logits(got, rows, frozenset({4}))
    assert got[0, 4] == got[0, 9] == float("-inf") and torch.isfinite(got[0, :4]).all()
    assert torch.isfinite(got[1]).all()  # three out: stops are allowed again
    ignoring = logits.clone()
    adjust_logits(ignoring, [AdjustRow(SamplingParams(min_new_tokens=3, ignore_eos=True), None, 0)], frozenset({4}))
    assert torch.isfinite(ignoring[0, 4])  # ignore_eos: EOS is not a stop, so it is not masked


def _hf(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_greedy_with_repetition_penalty_equals_hf_generate(tiny_checkpoint, make_engine):
    model_dir = tiny_checkpoint("llama")
    prompts = [_prompt(n, n) for n in (3, 21, 40)]
    cfg = GenerationConfig(max_new_tokens=MAX_NEW, do_sample=False, repetition_penalty=1.8, eos_token_id=None,
                           pad_token_id=None)
    hf = _hf(model_dir)
    with torch.no_grad():
        expected = [hf.generate(torch.tensor([p]), generation_config=cfg)[0, len(p):].tolist() for p in prompts]
    # Chunked prefill and the overlap scheduler (the default) on: counts must still be exactly committed.
    engine = make_engine(model_dir, chunked_prefill_size=16)
    outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0,
                                                               "ignore_eos": True, "repetition_penalty": 1.8})
    assert [o["output_ids"] for o in outs] == expected
    plain = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0,
                                                                "ignore_eos": True})
    assert [o["output_ids"] for o in plain] != expected  # the penalty changed the outputs: the check has teeth


def test_greedy_with_frequency_and_presence_penalties_equals_reference_loop(tiny_checkpoint, make_engine):
    model_dir = tiny_checkpoint("qwen2")
    prompt, freq, pres = _prompt(13, 7), 1.5, 0.7
    hf, ids = _hf(model_dir), list(prompt)
    counts = torch.zeros(hf.config.vocab_size)
    with torch.no_grad():
        for _ in range(MAX_NEW):  # OpenAI's definition, applied by hand to HF's logits
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
            adjusted = logits - freq * counts - pres * (counts > 0)
            token = int(adjusted.argmax())
            counts[token] += 1
            ids.append(token)
    engine = make_engine(model_dir)
    out = engine.generate(input_ids=prompt, sampling_params={
        "max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True, "frequency_penalty": freq,
        "presence_penalty": pres})
    assert out["output_ids"] == ids[len(prompt):]
    plain = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0,
                                                               "ignore_eos": True})
    assert plain["output_ids"] != out["output_ids"]  # the penalties changed the output: the check has teeth


def test_logit_bias_steers_greedy_but_logprobs_stay_the_models(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = _prompt(6, 11)
    plain = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
                            return_logprob=True)
    target = next(t for t in range(3, 500) if t not in plain["output_ids"])
    biased = engine.generate(input_ids=prompt, sampling_params={
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "logit_bias": {str(target): 100}}, return_logprob=True)
    assert biased["output_ids"] == [target] * 4
    # Logprobs are the model's own distribution (as HF's log_softmax), not the biased one.
    assert biased["meta_info"]["output_token_logprobs"][0][0] < -1.0


def test_min_new_tokens_holds_back_a_stop_token_until_reached(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = _prompt(6, 12)
    greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    first = engine.generate(input_ids=prompt, sampling_params=greedy)["output_ids"][0]
    stopped = engine.generate(input_ids=prompt, sampling_params={**greedy, "stop_token_ids": [first]})
    assert stopped["output_ids"] == [first] and stopped["meta_info"]["finish_reason"]["type"] == "stop"
    held = engine.generate(input_ids=prompt, sampling_params={**greedy, "stop_token_ids": [first], "min_new_tokens": 3})
    assert len(held["output_ids"]) >= 3 and first not in held["output_ids"][:2]


def _counted(counts: TokenCounts) -> Counter[int]:
    return Counter(dict(zip(counts.output_ids.tolist(), map(int, counts.output_counts.tolist()))))


def test_penalty_counts_untouched_by_a_discarded_result(tiny_checkpoint, tmp_path):
    rt = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log")
    try:
        req = rt.submit(_prompt(10, 13), "pen", max_new_tokens=20, ignore_eos=True, frequency_penalty=1.0)
        for _ in range(4):
            rt.step()
        assert req.counts is not None and req.inflight_batches == 1 and len(req.output_ids) >= 2
        # Live counts: exactly the committed tokens (so the check below is not vacuous).
        assert req.counts.num_tokens == len(req.output_ids)
        assert _counted(req.counts) == Counter(req.output_ids)
        before, committed = _counted(req.counts), list(req.output_ids)
        rt.abort("pen")
        rt.sched.process_oldest()  # the pending decode's result: discarded
        rt.sched.flush()
        rt.wait_durable()
        assert req.state.finish_reason is FinishReason.ABORT and req.output_ids == committed
        assert Kind.DISCARD in rt.kinds("pen")
        assert _counted(req.counts) == before and req.counts.num_tokens == len(committed)
    finally:
        rt.drain()
        rt.close()


@pytest.mark.parametrize("field,value", [
    ("frequency_penalty", 2.5), ("presence_penalty", "x"), ("repetition_penalty", 0), ("min_new_tokens", -1),
    ("logit_bias", {"abc": 1}), ("logit_bias", {"3": 101}), ("logit_bias", [1, 2]), ("no_stop_trim", 1),
    ("spaces_between_special_tokens", "no"),
])
def test_bad_sampling_control_is_refused_naming_its_field(field, value):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams.from_dict({field: value})
    assert err.value.param == field


def test_min_new_tokens_above_max_new_tokens_is_refused():
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams.from_dict({"max_new_tokens": 2, "min_new_tokens": 3})
    assert err.value.param == "min_new_tokens"


def test_sampling_seed_is_seed_and_a_conflict_is_refused():
    assert SamplingParams.from_dict({"sampling_seed": 7}).seed == 7
    assert SamplingParams.from_dict({"sampling_seed": 7, "seed": 7}).seed == 7
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams.from_dict({"sampling_seed": 7, "seed": 8})
    assert err.value.param == "sampling_seed"


def test_no_adjustment_is_computed_when_no_request_asks(tiny_checkpoint, make_engine, monkeypatch):
    import server.model_runner as runner_module

    def refuse(*_args, **_kwargs):
        raise AssertionError("adjust_logits ran for a batch with no penalties, bias or min_new_tokens")

    monkeypatch.setattr(runner_module, "adjust_logits", refuse)
    engine = make_engine(tiny_checkpoint("llama"))
    out = engine.generate(input_ids=_prompt(5, 14), sampling_params={"max_new_tokens": 3, "temperature": 0.7})
    assert len(out["output_ids"]) == 3


def test_a_matched_stop_token_is_trimmed_from_the_text_unless_no_stop_trim(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"))
    prompt = _prompt(6, 15)
    greedy = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    ids = engine.generate(input_ids=prompt, sampling_params=greedy)["output_ids"]
    stop = ids[2]
    assert stop not in ids[:2]
    tok = engine.tokenizer
    trimmed = engine.generate(input_ids=prompt, sampling_params={**greedy, "stop_token_ids": [stop]})
    kept = engine.generate(input_ids=prompt, sampling_params={**greedy, "stop_token_ids": [stop], "no_stop_trim": True})
    assert trimmed["output_ids"] == kept["output_ids"] == ids[:3]  # the token is output either way, as in SGLang
    assert trimmed["text"] == tok.decode(ids[:2]) and kept["text"] == tok.decode(ids[:3]) != trimmed["text"]


@pytest.mark.gpu
def test_adjustments_on_cuda_logits_equal_the_cpu_ones():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, VOCAB, generator=g)
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2,
                            logit_bias=((3, 1.5),), min_new_tokens=2, stop_token_ids=(9,))
    prompt, output = _prompt(6, 21, VOCAB), [4, 4, 8]
    got = {}
    for device in ("cpu", "cuda"):
        counts = TokenCounts(prompt, output[:1], torch.device(device))
        counts.add(output[1:])  # as a commit adds, on the counts' own device
        rows = [AdjustRow(params, counts, 1), AdjustRow(SamplingParams(), None, 0)]
        on_device = logits.to(device)
        adjust_logits(on_device, rows, frozenset({7}))
        got[device] = on_device.cpu()
    torch.testing.assert_close(got["cuda"], got["cpu"])
