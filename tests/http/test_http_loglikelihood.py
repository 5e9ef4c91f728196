"""Loglikelihood requests shaped as lm-eval sends them, against the real server, checked against
logprobs computed with HF transformers on the same checkpoint (and against the log)."""
from __future__ import annotations

import httpx
import pytest
import torch
from server_process import ServerProcess
from transformers import AutoModelForCausalLM

from commitlog import Kind, LogReader

TOL = 1e-4
# 150 tokens crosses the server's 64-token prefill chunks: positions scored across chunk borders.
PROMPT_LENS = (7, 150)


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    model_dir = tiny_checkpoint("llama")
    proc = ServerProcess(model_dir, tmp_path_factory.mktemp("loglik") / "log")
    proc.wait_healthy()
    yield proc, model_dir
    assert proc.terminate() == 0, proc.stderr()


@pytest.fixture(scope="module")
def hf_logprobs(served):
    """Per prompt: [len-1, vocab] log-softmax rows, row i scoring prompt position i+1."""
    hf = AutoModelForCausalLM.from_pretrained(served[1], dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in _prompts():
            logits = hf(torch.tensor([ids])).logits[0].float()
            out.append(torch.log_softmax(logits, dim=-1))
    return out


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(77)
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _check_prompt_logprobs(got: list[float | None], ids: list[int], ref: torch.Tensor) -> None:
    assert got[0] is None and len(got) == len(ids)
    want = ref[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(got[1:], dtype=torch.float32), want, atol=TOL, rtol=0)


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_completions_echo_logprobs_equal_hf_as_lm_eval_asks(served, hf_logprobs, max_tokens):
    proc, _ = served
    prompts = _prompts()
    body = {"model": "default", "prompt": prompts, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
            "echo": True, "seed": 1234}
    model = httpx.get(f"{proc.url}/v1/models").json()["data"][0]["id"]
    res = httpx.post(f"{proc.url}/v1/completions", json=body | {"model": model}, timeout=120)
    assert res.status_code == 200, res.text
    choices = sorted(res.json()["choices"], key=lambda c: c["index"])
    for choice, ids, ref in zip(choices, prompts, hf_logprobs):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ids) + max_tokens == len(lp["text_offset"])
        _check_prompt_logprobs(lp["token_logprobs"][: len(ids)], ids, ref)
        assert lp["top_logprobs"][0] is None
        for pos, top in enumerate(lp["top_logprobs"][1 : len(ids)], start=1):  # the top-1 is HF's argmax
            (value,) = top.values()
            assert abs(value - float(ref[pos - 1].max())) < TOL
        assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
        if max_tokens:  # lm-eval drops this last token; it is the greedy continuation, scored like HF
            assert abs(lp["token_logprobs"][-1] - float(ref[-1].max())) < TOL
    assert res.json()["usage"]["completion_tokens"] == max_tokens * len(prompts)


def test_completions_echo_returns_the_prompt_text_first(served):
    proc, _ = served
    model = httpx.get(f"{proc.url}/v1/models").json()["data"][0]["id"]
    res = httpx.post(f"{proc.url}/v1/completions", json={"model": model, "prompt": "hello world", "max_tokens": 0,
                                                          "echo": True}, timeout=60)
    assert res.status_code == 200, res.text
    assert res.json()["choices"][0]["text"] == "hello world" and res.json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("max_new_tokens", [0, 1])
def test_generate_input_logprobs_equal_hf_as_sglang_shapes_them(served, hf_logprobs, max_new_tokens):
    proc, _ = served
    for ids, ref in zip(_prompts(), hf_logprobs):
        res = httpx.post(f"{proc.url}/generate", json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}, timeout=120)
        assert res.status_code == 200, res.text
        meta = res.json()["meta_info"]
        tokens = meta["input_token_logprobs"]
        assert [t[1] for t in tokens] == ids and tokens[0] == [None, ids[0], None]
        _check_prompt_logprobs([t[0] for t in tokens], ids, ref)
        tops = meta["input_top_logprobs"]
        assert tops[0] is None and len(tops) == len(ids)
        for pos, top in enumerate(tops[1:], start=1):
            want = ref[pos - 1].topk(2)
            assert torch.allclose(torch.tensor([v for v, _, _ in top]), want.values, atol=TOL, rtol=0)
        assert len(res.json()["output_ids"]) == max_new_tokens


def test_prompt_logprobs_are_in_the_log_as_the_client_got_them(served):
    proc, _ = served
    ids = _prompts()[1]
    res = httpx.post(f"{proc.url}/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
        "logprob_start_len": 0, "top_logprobs_num": 1, "rid": "loglik-logged"}, timeout=120)
    meta = res.json()["meta_info"]
    reader = LogReader.open(proc.log_dir)
    try:
        records = reader.request_records("loglik-logged")
        state = reader.rebuild("loglik-logged")
    finally:
        reader.close()
    commits = [r for r in records if r.kind is Kind.COMMIT]
    assert len(commits) > 1  # the prompt's chunks each committed their share
    assert state.input_logprobs == [t[0] for t in meta["input_token_logprobs"][1:]]
    assert [[[lp, t, None] for t, lp in top] for top in state.input_top_logprobs] == meta["input_top_logprobs"][1:]
    audit = httpx.get(f"{proc.url}/requests/loglik-logged").json()
    assert audit["input_logprobs"] == state.input_logprobs
