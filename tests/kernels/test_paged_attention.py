"""The CPU attention kernel against the torch reference: extend, decode and mixed batches, any GQA ratio,
head sizes on and off its specialised paths, slots scattered anywhere in the pool."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from layouts import scattered_layout

from kernels.backend import BatchLayout
from kernels.cpu_attention import CpuAttentionBackend, build_kernel, kernel_available, paged_attention
from kernels.registry import BackendUnavailableError, create_backend
from kernels.torch_attention import TorchAttentionBackend

pytestmark = pytest.mark.skipif(not kernel_available(), reason="no C compiler: the cpu backend is not built here")


class Pool:
    def __init__(self, slots: int, layers: int, hkv: int, d: int, dtype: torch.dtype = torch.float32) -> None:
        g = torch.Generator().manual_seed(slots)
        self.k_buffers = [torch.randn(slots, hkv, d, generator=g).to(dtype) for _ in range(layers)]
        self.v_buffers = [torch.randn(slots, hkv, d, generator=g).to(dtype) for _ in range(layers)]

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffers[layer_id][slots] = k
        self.v_buffers[layer_id][slots] = v


@st.composite
def batches(draw):
    hkv = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 4, 7]))
    d = draw(st.sampled_from([8, 20, 32, 48, 64, 128]))  # 20: off the 8-lane path
    reqs = draw(st.lists(st.tuples(st.integers(0, 70), st.integers(1, 9)), min_size=1, max_size=6))
    decode = draw(st.booleans())
    reqs = [(prefix, 1 if decode else new) for prefix, new in reqs]
    seed = draw(st.integers(0, 2**16))
    # A large scale spreads the scores over hundreds of units: most weights underflow to 0.
    scale = draw(st.sampled_from([d**-0.5, 40.0]))
    return hkv, group, d, reqs, seed, scale




@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(batch=batches())
def test_cpu_kernel_matches_torch_reference_on_extend_decode_and_mixed_batches(batch):
    hkv, group, d, reqs, seed, scale = batch
    tokens = sum(new for _, new in reqs)
    pool_slots = sum(p + n for p, n in reqs) + 8
    layout = scattered_layout(reqs, pool_slots, seed)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(tokens, hkv * group, d, generator=g)
    k, v = torch.randn(tokens, hkv, d, generator=g), torch.randn(tokens, hkv, d, generator=g)
    ours, ref = Pool(pool_slots, 1, hkv, d), Pool(pool_slots, 1, hkv, d)
    got = CpuAttentionBackend(ours, scale).plan(layout).attend(0, q, k, v)
    want = TorchAttentionBackend(ref, scale).plan(layout).attend(0, q, k, v)
    assert torch.equal(ours.k_buffers[0], ref.k_buffers[0]) and torch.equal(ours.v_buffers[0], ref.v_buffers[0])
    # Stated tolerance: 1e-5 at the model's own scale. Scores in the hundreds carry fp32 rounding of
    # ~1e-5 each into their weights, in the reference as much as here: 2e-4 there.
    tol = 1e-5 if scale < 1 else 2e-4
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_a_requests_result_does_not_depend_on_its_batch_or_thread_count():
    """Bitwise: batch invariance is what lets `replay --reexecute` and overlap on/off agree exactly. The
    batch is large enough (a 48-token extend over 400 cached) for the kernel to use its threads; each
    request alone is small enough to run on the calling thread."""
    reqs = [(300, 1), (17, 1), (120, 1), (64, 1), (400, 48)]
    pool = Pool(1000, 1, 2, 64)
    layout = scattered_layout(reqs, 1000, seed=5)
    q = torch.randn(52, 8, 64)
    together = paged_attention(q, pool.k_buffers[0], pool.v_buffers[0], layout, 0.125, num_threads=4)
    kv_ptr, qo_ptr = layout.kv_indptr.tolist(), layout.qo_indptr.tolist()
    for r, (_, new) in enumerate(reqs):
        rows = slice(qo_ptr[r], qo_ptr[r + 1])
        alone = BatchLayout.of_requests(layout.out_cache_loc[rows], [layout.kv_indices[kv_ptr[r] : kv_ptr[r + 1]]], [new])
        single = paged_attention(q[rows], pool.k_buffers[0], pool.v_buffers[0], alone, 0.125, num_threads=1)
        assert torch.equal(single, together[rows]), r


def _cpu_has_avx512() -> bool:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return "avx512f" in flags and "avx512dq" in flags


@st.composite
def extend_batches(draw):
    """Batches with multi-row extends (the 512-bit path pairs their rows) beside decodes, at head dims on
    and off that path, odd and even GQA groups, prefixes of any length."""
    hkv = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 3, 4]))
    d = draw(st.sampled_from([8, 32, 64, 128]))
    reqs = draw(st.lists(st.tuples(st.integers(0, 90), st.sampled_from([1, 2, 3, 7, 16, 33])), min_size=1, max_size=5))
    seed = draw(st.integers(0, 2**16))
    threads = draw(st.sampled_from([1, 2]))
    return hkv, group, d, reqs, seed, threads


@pytest.mark.skipif(not _cpu_has_avx512(), reason="this CPU has no AVX-512: only the 256-bit path is built here")
@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(batch=extend_batches())
def test_the_512_bit_path_computes_bit_for_bit_what_the_256_bit_path_does(batch):
    """A machine without AVX-512 builds the kernel without its 512-bit path; a logged request must
    re-execute to the same bits on either, so the wide path may only regroup the same arithmetic."""
    hkv, group, d, reqs, seed, threads = batch
    pool_slots = sum(p + n for p, n in reqs) + 8
    layout = scattered_layout(reqs, pool_slots, seed)
    pool = Pool(pool_slots, 1, hkv, d)
    q = torch.randn(sum(n for _, n in reqs), hkv * group, d, generator=torch.Generator().manual_seed(seed))
    narrow = build_kernel(("-mno-avx512f",))
    wide = paged_attention(q, pool.k_buffers[0], pool.v_buffers[0], layout, d**-0.5, threads)
    assert torch.equal(wide, paged_attention(q, pool.k_buffers[0], pool.v_buffers[0], layout, d**-0.5, threads, narrow))


def test_auto_picks_the_cpu_kernel_for_fp32_and_the_reference_for_other_dtypes():
    assert create_backend("auto", Pool(8, 1, 2, 32), 0.1).name == "cpu"
    assert create_backend("auto", Pool(8, 1, 2, 32, torch.bfloat16), 0.1).name == "torch"
    assert create_backend("torch", Pool(8, 1, 2, 32), 0.1).name == "torch"
    with pytest.raises(BackendUnavailableError, match="float32"):
        create_backend("cpu", Pool(8, 1, 2, 32, torch.bfloat16), 0.1)
    with pytest.raises(BackendUnavailableError, match="unknown attention backend"):
        create_backend("flash", Pool(8, 1, 2, 32), 0.1)


def test_kernels_package_never_imports_the_server():
    code = ("import sys, kernels.registry, kernels.cpu_attention, kernels.torch_attention, kernels.native; "
            "bad = sorted(m for m in sys.modules if m == 'server' or m.startswith('server.')); "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_openmp_build_is_used_only_where_the_process_already_runs_libgomp(monkeypatch):
    """Without a libgomp already loaded (a torch on another OpenMP runtime), an OpenMP build would bring
    in a second runtime whose workers compete with the first: the plain build is loaded instead."""
    import kernels.native as native

    if native.process_libgomp() is None:
        pytest.skip("this process runs no libgomp")
    with_runtime = native.load("paged_attention.c", openmp=True)
    plain = native.load("paged_attention.c")
    assert with_runtime._name != plain._name  # torch's libgomp is there: the OpenMP build
    monkeypatch.setattr(native, "process_libgomp", lambda: None)
    assert native.load("paged_attention.c", openmp=True)._name == plain._name
