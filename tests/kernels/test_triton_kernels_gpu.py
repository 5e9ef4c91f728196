"""The Triton kernels on a CUDA device against their references (the references run on CPU).
Marked `gpu`: deselected by default, skipped with the reason where CUDA is absent; ops/gpu_check.sh
is meant to run them on a GPU machine."""
from __future__ import annotations

import importlib

import pytest
import torch
from layouts import scattered_layout

from kernels import reference
from kernels.backend import BatchLayout

pytestmark = pytest.mark.gpu




def _on(layout: BatchLayout, device: str) -> BatchLayout:
    return BatchLayout(*(t.to(device) for t in (layout.out_cache_loc, layout.qo_indptr, layout.kv_indptr,
                                                 layout.kv_indices)), layout.is_decode)


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("reqs", [[(0, 7)], [(300, 1), (5, 1), (64, 1)], [(100, 9), (31, 1), (0, 1)]])
def test_triton_attention_on_cuda_matches_the_reference(group, reqs):
    tk = importlib.import_module("kernels.triton_kernels")
    g = torch.Generator().manual_seed(7)
    hkv, d = 2, 64
    tokens, pool_slots = sum(n for _, n in reqs), sum(p + n for p, n in reqs) + 4
    layout = scattered_layout(reqs, pool_slots, 1)
    q = torch.randn(tokens, hkv * group, d, generator=g)
    k, v = torch.randn(tokens, hkv, d, generator=g), torch.randn(tokens, hkv, d, generator=g)
    pools = [torch.randn(pool_slots, hkv, d, generator=g) for _ in range(2)]
    dev = [p.cuda() for p in pools]
    tk.store_kv(dev[0], dev[1], layout.out_cache_loc.cuda(), k.cuda(), v.cuda())
    reference.store_kv(pools[0], pools[1], layout.out_cache_loc, k, v)
    assert torch.equal(dev[0].cpu(), pools[0])
    got = tk.paged_attention(q.cuda(), dev[0], dev[1], _on(layout, "cuda"), d**-0.5).cpu()
    torch.testing.assert_close(got, reference.paged_attention(q, pools[0], pools[1], layout, d**-0.5),
                               rtol=1e-4, atol=1e-4)  # TF32-free fp32, but another summation order


def test_triton_bitmask_and_segment_gather_on_cuda_match_the_reference():
    tk = importlib.import_module("kernels.triton_kernels")
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 1000, generator=g)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 32), generator=g, dtype=torch.int64).to(torch.int32)
    ours = logits.cuda()
    tk.apply_token_bitmask(ours, bitmask.cuda(), [0, 2])
    reference.apply_token_bitmask(logits, bitmask, [0, 2])
    assert torch.equal(ours.cpu(), logits)
    packed, starts, lengths = torch.arange(40.0), torch.tensor([0, 5, 5, 39]), torch.tensor([5, 0, 9, 1])
    got = tk.gather_segments(packed.cuda(), starts.cuda(), lengths.cuda()).cpu()
    assert torch.equal(got, reference.gather_segments(packed, starts, lengths))
