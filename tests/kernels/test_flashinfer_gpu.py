"""The flashinfer attention backend on a CUDA device against the plain-torch reference (run in fp32
on the same half-precision inputs): extend, decode and mixed batches, GQA 1/2/4, slots scattered over
the pool. Marked `gpu`: skipped with the reason without CUDA or without flashinfer; ops/gpu_check.sh
runs them. Tolerance 2e-3: fp16 storage, fp32 accumulation in another order."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from layouts import scattered_layout

from kernels import reference
from kernels.backend import BatchLayout

pytestmark = pytest.mark.gpu


class _Pool:
    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffers, self.v_buffers = [k], [v]

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffers[layer_id][slots] = k
        self.v_buffers[layer_id][slots] = v


def _on_cuda(layout: BatchLayout, qo_lens: list[int], kv_lens: list[int]) -> BatchLayout:
    moved = BatchLayout(*(t.cuda() for t in (layout.out_cache_loc, layout.qo_indptr, layout.kv_indptr,
                                              layout.kv_indices)), layout.is_decode, max(kv_lens))
    return moved.with_host_indptrs(qo_lens, kv_lens)


@pytest.fixture(scope="module", autouse=True)
def _flashinfer_present():
    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer is not installed here (the `cuda` extra)")


@pytest.mark.parametrize("dtype", [torch.float16])  # one dtype: each FlashInfer config is compiled at first use
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("reqs", [[(0, 7)], [(300, 1), (5, 1), (64, 1)], [(100, 9), (31, 1), (0, 1)]],
                         ids=["extend", "decode", "mixed"])
def test_flashinfer_backend_matches_the_reference(reqs, group, dtype):
    from kernels.registry import create_backend

    g = torch.Generator().manual_seed(5)
    hkv, d = 2, 64
    tokens, pool_slots = sum(n for _, n in reqs), sum(p + n for p, n in reqs) + 4
    layout = scattered_layout(reqs, pool_slots, 3)
    q = torch.randn(tokens, hkv * group, d, generator=g).to(dtype)
    k, v = (torch.randn(tokens, hkv, d, generator=g).to(dtype) for _ in range(2))
    pools = [torch.randn(pool_slots, hkv, d, generator=g).to(dtype) for _ in range(2)]
    ours = _Pool(pools[0].cuda(), pools[1].cuda())
    backend = create_backend("flashinfer", ours, d**-0.5)
    assert backend.name == "flashinfer"
    cuda_layout = _on_cuda(layout, [n for _, n in reqs], [p + n for p, n in reqs])
    got = backend.plan(cuda_layout).attend(0, q.cuda(), k.cuda(), v.cuda()).float().cpu()
    ref = [p.float() for p in pools]
    reference.store_kv(ref[0], ref[1], layout.out_cache_loc, k.float(), v.float())
    want = reference.paged_attention(q.float(), ref[0], ref[1], layout, d**-0.5)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    assert torch.equal(ours.k_buffers[0].cpu().float(), ref[0])


def test_auto_picks_flashinfer_on_cuda_for_half_precision_and_triton_for_fp32():
    from kernels.registry import create_backend

    half = _Pool(torch.zeros(8, 2, 64, dtype=torch.float16, device="cuda"),
                 torch.zeros(8, 2, 64, dtype=torch.float16, device="cuda"))
    full = _Pool(torch.zeros(8, 2, 64, device="cuda"), torch.zeros(8, 2, 64, device="cuda"))
    assert create_backend("auto", half, 0.125).name == "flashinfer"
    assert create_backend("auto", full, 0.125).name == "triton"
