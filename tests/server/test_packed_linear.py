"""The oneDNN linear backend: every nn.Linear is swapped for a packed matmul whose results equal
nn.Linear's up to float rounding, rows of any count (zero included), and the choice is refused
clearly where it cannot run."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from server.errors import ConfigError
from server.models.loader import load_model
from server.models.packed_linear import ONEDNN_MIN_HIDDEN, PackedLinear, apply_linear_backend, onednn_available

pytestmark = pytest.mark.skipif(not onednn_available(torch.float32), reason="torch here has no oneDNN")


def test_onednn_backend_packs_every_linear_and_matches_nn_linear_for_any_row_count(tiny_checkpoint):
    model_dir = tiny_checkpoint("qwen2")  # q/k/v biases: the packed path carries them
    reference, packed = load_model(model_dir, torch.float32), load_model(model_dir, torch.float32)
    assert apply_linear_backend(packed, "onednn", torch.float32, 64) == "onednn"
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    swapped = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len(swapped) == sum(isinstance(m, nn.Linear) for m in reference.modules())
    g = torch.Generator().manual_seed(0)
    for linear_ref, linear_packed in zip([m for m in reference.modules() if isinstance(m, nn.Linear)], swapped):
        for rows in (0, 1, 7, 64):
            x = torch.randn(rows, linear_ref.in_features, generator=g)
            with torch.inference_mode():
                want, got = linear_ref(x), linear_packed(x)
            assert got.shape == want.shape == (rows, linear_ref.out_features)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_torch_backend_keeps_nn_linear_and_onednn_is_refused_for_bfloat16(tiny_checkpoint):
    model = load_model(tiny_checkpoint("llama"), torch.float32)
    assert apply_linear_backend(model, "torch", torch.float32, 4096) == "torch"
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    with pytest.raises(ConfigError, match="float32"):
        apply_linear_backend(model, "onednn", torch.bfloat16, 4096)
    assert apply_linear_backend(model, "auto", torch.bfloat16, 4096) == "torch"


def test_auto_packs_only_models_large_enough_to_gain_from_onednn(tiny_checkpoint):
    small, large = (load_model(tiny_checkpoint("llama"), torch.float32) for _ in range(2))
    assert apply_linear_backend(small, "auto", torch.float32, ONEDNN_MIN_HIDDEN - 1) == "torch"
    assert not any(isinstance(m, PackedLinear) for m in small.modules())
    assert apply_linear_backend(large, "auto", torch.float32, ONEDNN_MIN_HIDDEN) == "onednn"
    assert any(isinstance(m, PackedLinear) for m in large.modules())
