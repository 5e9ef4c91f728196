"""The Triton kernels against their plain-torch references, under TRITON_INTERPRET=1 on CPU (on a
CUDA machine ops/gpu_check.sh runs them on the device): small shapes, odd lengths, GQA ratios
1/2/4, empty segments, slots scattered over the pool. fp32; tolerance 1e-5 (attention: the split
merge sums in another order than SDPA)."""
from __future__ import annotations

import importlib
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from layouts import scattered_layout

from kernels import reference
from kernels.backend import BatchLayout

triton = pytest.importorskip("triton")


@pytest.fixture(scope="module")
def tk():
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine these run on the device (ops/gpu_check.sh), not the interpreter")
    assert os.environ.get("TRITON_INTERPRET") == "1", "tests/conftest.py sets it before triton is imported"
    return importlib.import_module("kernels.triton_kernels")


@st.composite
def ragged_batches(draw):
    hkv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 4]))  # GQA ratios
    d = draw(st.sampled_from([8, 20, 32]))
    # (prefix, new): decode (new 1), extend, prompts longer than one split (64) with odd lengths.
    reqs = draw(st.lists(st.tuples(st.integers(0, 150), st.integers(1, 5)), min_size=1, max_size=4))
    return hkv, group, d, reqs, draw(st.integers(0, 2**16))




@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(batch=ragged_batches())
def test_triton_attention_and_kv_store_match_the_reference_on_extend_decode_and_mixed(tk, batch):
    hkv, group, d, reqs, seed = batch
    g = torch.Generator().manual_seed(seed)
    tokens, pool_slots = sum(n for _, n in reqs), sum(p + n for p, n in reqs) + 4
    layout = scattered_layout(reqs, pool_slots, seed)
    q = torch.randn(tokens, hkv * group, d, generator=g)
    k, v = torch.randn(tokens, hkv, d, generator=g), torch.randn(tokens, hkv, d, generator=g)
    pools = [torch.randn(pool_slots, hkv, d, generator=g) for _ in range(2)]
    ours, ref = [p.clone() for p in pools], [p.clone() for p in pools]
    tk.store_kv(ours[0], ours[1], layout.out_cache_loc, k, v)
    reference.store_kv(ref[0], ref[1], layout.out_cache_loc, k, v)
    assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1])
    got = tk.paged_attention(q, ours[0], ours[1], layout, d**-0.5)
    want = reference.paged_attention(q, ref[0], ref[1], layout, d**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_triton_attention_of_a_request_does_not_depend_on_its_batch(tk):
    pool = [torch.randn(400, 2, 16, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    reqs = [(150, 1), (3, 1), (70, 1)]  # the long one sets the batch's split count
    layout = scattered_layout(reqs, 400, seed=3)
    q = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(9))
    together = tk.paged_attention(q, pool[0], pool[1], layout, 0.25)
    kv_ptr = layout.kv_indptr.tolist()
    for r in range(3):
        alone = BatchLayout.of_requests(layout.out_cache_loc[r : r + 1], [layout.kv_indices[kv_ptr[r] : kv_ptr[r + 1]]], [1])
        assert torch.equal(tk.paged_attention(q[r : r + 1], pool[0], pool[1], alone, 0.25)[0], together[r]), r


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 300])
def test_triton_bitmask_matches_the_reference_including_partial_words(tk, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(4, vocab, generator=g)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, words), generator=g, dtype=torch.int64).to(torch.int32)
    ours, ref = logits.clone(), logits.clone()
    rows = [0, 2, 3]
    tk.apply_token_bitmask(ours, bitmask, rows)
    reference.apply_token_bitmask(ref, bitmask, rows)
    assert torch.equal(ours, ref)
    assert torch.equal(ours[1], logits[1])  # a row not listed is left alone
    tk.apply_token_bitmask(ours, bitmask, [])  # nothing to do


def test_triton_segment_gather_matches_the_reference_with_empty_segments(tk):
    packed = torch.arange(50, dtype=torch.float32) * 0.5
    starts = torch.tensor([0, 3, 3, 10, 49], dtype=torch.int64)
    lengths = torch.tensor([3, 0, 7, 0, 1], dtype=torch.int64)
    assert torch.equal(tk.gather_segments(packed, starts, lengths), reference.gather_segments(packed, starts, lengths))
    none = torch.zeros(0, dtype=torch.int64)
    assert tk.gather_segments(packed, none, none).numel() == 0


def test_triton_backend_is_registered_and_attends_like_the_torch_backend(tk):
    from kernels.registry import create_backend

    class Pool:
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(1)
            self.k_buffers, self.v_buffers = [torch.randn(90, 2, 8, generator=g)], [torch.randn(90, 2, 8, generator=g)]

        def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
            self.k_buffers[layer_id][slots] = k
            self.v_buffers[layer_id][slots] = v

    layout = scattered_layout([(40, 3), (7, 1)], 90, seed=2)
    q, k, v = torch.randn(4, 4, 8), torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    ours, ref = Pool(), Pool()
    backend = create_backend("triton", ours, 0.3)
    assert backend.name == "triton"
    got = backend.plan(layout).attend(0, q, k, v)
    want = create_backend("torch", ref, 0.3).plan(layout).attend(0, q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(ours.k_buffers[0], ref.k_buffers[0])


def test_engine_with_the_triton_backend_gives_the_torch_backends_greedy_tokens(tk, tiny_checkpoint, make_engine):
    prompts = [[5, 9, 17, 33, 2, 71, 8], [40, 41]]  # a prefill of each, then decodes side by side
    params = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    outputs = {}
    for backend in ("torch", "triton"):
        engine = make_engine(tiny_checkpoint("llama"), attention_backend=backend)
        assert engine.scheduler.runner.attention.name == backend
        outputs[backend] = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
    assert outputs["triton"] == outputs["torch"] and all(len(ids) == 3 for ids in outputs["torch"])
