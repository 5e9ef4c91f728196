"""`--device` on a machine without CUDA, the CPU path of the CUDA runtime, and the registry's answers
for the CUDA-only backends here. (The CUDA side itself: tests/server/test_cuda_engine.py, `gpu`.)"""
from __future__ import annotations

import pytest
import torch

from kernels.backend import BatchLayout
from kernels.registry import BackendUnavailableError, create_backend
from server.config import ServerArgs
from server.device import resolve_device
from server.errors import ConfigError

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answers given where CUDA is absent")


def test_device_flag_accepts_auto_cpu_cuda_and_refuses_others():
    for name in ("auto", "cpu", "cuda"):
        assert ServerArgs.from_kwargs(device=name).device == name
    with pytest.raises(ConfigError, match="--device must be one of auto, cpu, cuda"):
        ServerArgs.from_kwargs(device="tpu")


@no_cuda
def test_device_cuda_without_cuda_is_a_clear_config_error(tiny_checkpoint):
    with pytest.raises(ConfigError, match="--device cuda: torch sees no CUDA device"):
        resolve_device("cuda")
    from server import Engine

    with pytest.raises(ConfigError, match="no CUDA device"):
        Engine(model_path=str(tiny_checkpoint("llama")), device="cuda", max_total_tokens=256)


@no_cuda
def test_device_auto_is_the_cpu_here_and_the_cpu_runtime_has_no_stream(make_engine, tiny_checkpoint):
    assert resolve_device("auto") == torch.device("cpu")
    engine = make_engine(tiny_checkpoint("llama"), device="auto")
    runner = engine.scheduler.runner
    assert runner.stream is None and runner.device.type == "cpu"
    assert engine.scheduler.kv_pool.k_buffers[0].device.type == "cpu"
    out = engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 3, "temperature": 0})
    assert len(out["output_ids"]) == 3


def _cpu_pool(dtype: torch.dtype = torch.float32):
    class Pool:
        k_buffers = [torch.zeros(8, 2, 64, dtype=dtype)]
        v_buffers = [torch.zeros(8, 2, 64, dtype=dtype)]

        def store(self, layer_id, slots, k, v) -> None:
            raise AssertionError("not used")

    return Pool()


def test_flashinfer_backend_on_the_cpu_is_refused_with_the_reason():
    with pytest.raises(BackendUnavailableError, match="runs on CUDA only"):
        create_backend("flashinfer", _cpu_pool(torch.float16), 0.125)
    assert create_backend("auto", _cpu_pool(), 0.125).name in ("cpu", "torch")


def test_host_index_pointers_follow_the_layout_through_a_mixed_join():
    ext = BatchLayout.of_requests(torch.tensor([3, 4]), [torch.tensor([1, 2, 3, 4])], [2]).with_host_indptrs([2], [4])
    dec = BatchLayout.of_requests(torch.tensor([7, 9]), [torch.tensor([5, 7]), torch.tensor([8, 6, 9])], [1, 1])
    dec = dec.with_host_indptrs([1, 1], [2, 3])
    mixed = ext.then(dec)
    assert mixed.host_indptrs is not None
    assert mixed.host_indptrs[0].tolist() == mixed.qo_indptr.tolist() == [0, 2, 3, 4]
    assert mixed.host_indptrs[1].tolist() == mixed.kv_indptr.tolist() == [0, 4, 6, 9]
    assert mixed.longest_kv() == 4 and mixed.max_kv_len == 4


def test_forward_handle_waits_on_its_event_once_and_reads_back_once():
    from server.model_runner import ForwardHandle, InputLogprobs, PendingResult

    class Event:
        waits = 0

        def synchronize(self) -> None:
            Event.waits += 1

    pending = PendingResult(torch.tensor([4, 2]), torch.tensor([-0.5, -1.5]), torch.zeros(2, 0, dtype=torch.int64),
                            torch.zeros(2, 0), InputLogprobs(), torch.zeros(0, 8))
    handle = ForwardHandle(1, None, pending, Event())  # type: ignore[arg-type]
    first = handle.result()
    assert handle.result() is first and Event.waits == 1
    assert first.next_token_ids == [4, 2] and first.next_token_logprobs == [-0.5, -1.5]
    assert first.top_ids == [[], []] and first.input_logprobs == [] and first.hidden_states.shape == (0, 8)
