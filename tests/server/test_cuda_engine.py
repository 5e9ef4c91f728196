"""The engine on a CUDA device: greedy parity of every attention backend with torch (overlap on and
off, chunked prefill), torch on CUDA against torch on the CPU, the real overlap (events), and the
seed's abort window run ten times per backend. Marked `gpu`: skipped with the reason without CUDA;
ops/gpu_check.sh runs them."""
from __future__ import annotations

import importlib.util

import pytest
from abort_window import check_abort_with_final_chunk_pending, prompt
from scripted import ScriptedRuntime

from server.models.demo import CheckpointSpec, build_checkpoint

pytestmark = pytest.mark.gpu

# head_dim 64: a size every backend serves (FlashInfer's kernels are built for 64/128/256).
PARITY_SPEC = CheckpointSpec(architecture="LlamaForCausalLM", hidden_size=128, intermediate_size=256,
                             num_heads=4, num_kv_heads=2, head_dim=64, seed=5)
# FlashInfer serves half precision only; it is compared with torch in the same dtype.
BACKENDS = {"torch": "float32", "triton": "float32", "flashinfer": "float16"}
PROMPTS = [prompt(n, seed) for n, seed in ((3, 11), (17, 12), (40, 13), (64, 14))]
CHUNK = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("ckpt-cuda"), PARITY_SPEC)


def _needs(backend: str) -> None:
    if backend == "flashinfer" and importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer is not installed here (the `cuda` extra)")


def _greedy(make_engine, checkpoint, **kwargs) -> list[list[int]]:
    engine = make_engine(checkpoint, chunked_prefill_size=CHUNK, **kwargs)
    outs = engine.generate(input_ids=PROMPTS, sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                                "ignore_eos": True})
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap_on", "overlap_off"])
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_i8_greedy_parity_of_each_backend_with_torch_on_cuda(make_engine, checkpoint, backend, overlap):
    _needs(backend)
    dtype = BACKENDS[backend]
    ref = _greedy(make_engine, checkpoint, device="cuda", attention_backend="torch", dtype=dtype)
    got = _greedy(make_engine, checkpoint, device="cuda", attention_backend=backend, dtype=dtype,
                  disable_overlap_schedule=not overlap)
    assert got == ref and all(len(ids) == 12 for ids in ref)


def test_i8_torch_on_cuda_gives_torch_on_cpu_greedy_tokens(make_engine, checkpoint):
    cuda = _greedy(make_engine, checkpoint, device="cuda", attention_backend="torch")
    cpu = _greedy(make_engine, checkpoint, device="cpu", attention_backend="torch")
    assert cuda == cpu


def test_cuda_runtime_keeps_pools_on_the_device_and_waits_on_events(make_engine, checkpoint):
    engine = make_engine(checkpoint, device="cuda")
    sched = engine.scheduler
    assert sched.kv_pool.k_buffers[0].is_cuda and sched.req_pool.table.is_cuda
    assert sched.runner.stream is not None and sched.runner.future_tokens.is_cuda
    handles = []
    original = sched.runner.launch
    sched.runner.launch = lambda batch: handles.append(original(batch)) or handles[-1]  # type: ignore[method-assign]
    engine.generate(input_ids=PROMPTS[1], sampling_params={"max_new_tokens": 4, "temperature": 0})
    assert handles and all(h._done is not None for h in handles), "every CUDA forward ends in an event"


@pytest.mark.parametrize("attempt", range(10))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_i2_abort_with_final_chunk_pending_on_cuda(checkpoint, tmp_path, backend, attempt):
    _needs(backend)
    rt = ScriptedRuntime(checkpoint, tmp_path / "log", chunked_prefill_size=CHUNK, device="cuda",
                         attention_backend=backend, dtype=BACKENDS[backend])
    try:
        check_abort_with_final_chunk_pending(rt)
    finally:
        rt.close()

