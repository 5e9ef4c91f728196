"""Shared fixtures: tiny random-weight checkpoints built locally, and engines that must
hand every KV slot back by the end of each test."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run under triton's interpreter. Triton reads the switch when it
# is first imported (its own library functions are decorated then), so it is set before anything
# here imports triton; on a CUDA machine the kernels run on the device.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Engines here run their trunk eager unless a test asks for `torch_compile="on"`: compiling costs
# seconds per engine and the suite builds hundreds (servers it starts inherit this too).
os.environ.setdefault("TOKENLEDGER_TORCH_COMPILE", "off")

from server.models.demo import CheckpointSpec, build_checkpoint  # noqa: E402

TINY_SPECS = {
    "llama": CheckpointSpec(architecture="LlamaForCausalLM", seed=1),
    # Qwen2: q/k/v biases and tied embeddings.
    "qwen2": CheckpointSpec(architecture="Qwen2ForCausalLM", tie_word_embeddings=True, seed=2),
    # Qwen3: q/k RMSNorm and a head_dim that is not hidden_size / num_heads.
    "qwen3": CheckpointSpec(architecture="Qwen3ForCausalLM", head_dim=32, seed=3),
}


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_checkpoint(tmp_path_factory.mktemp(f"ckpt-{name}"), TINY_SPECS[name])
        return built[name]

    return get


@pytest.fixture
def make_engine() -> Iterator[Callable[..., object]]:
    """Engines made here are checked after the test: KV free == capacity, pools consistent."""
    from server import Engine

    engines: list[Engine] = []

    def make(model_path: Path | str, **kwargs: object) -> Engine:
        kwargs.setdefault("max_total_tokens", 4096)
        kwargs.setdefault("device", "cpu")  # the suite runs on the CPU by default; gpu tests ask for cuda
        engine = Engine(model_path=str(model_path), **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown()
        sched = engine.scheduler
        assert sched.is_idle, "requests still live at the end of the test"
        assert sched.kv_live_tokens == 0, "KV slots leaked"
        sched.check_integrity()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests (deselected by default; `-m gpu` selects them) are skipped, saying why, without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: none is visible to torch here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
