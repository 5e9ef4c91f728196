"""Linear layers as oneDNN matmuls over weights packed once at load (CPU, fp32).

`nn.Linear` calls MKL's sgemm, which re-reads the weight in its stored layout on every call.
oneDNN (bundled with torch's CPU build) takes the weight reordered once into its blocked
layout; measured on a hidden-1024 Llama, the forward ran ~1.6x faster (docs/benchmarks.md).
The results equal `nn.Linear`'s up to float rounding (the two sum in different orders), and a row's
result does not depend on how many rows share the call.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from server.errors import ConfigError

_PACKING_BATCH_HINT = 64  # the M oneDNN tunes the packed layout for; any M runs on it
# `auto` packs a model whose hidden size is at least this. oneDNN's call costs ~20 us more than MKL's,
# which a small model's matmuls do not pay back: compiled, measured in pairs, a hidden-128 Llama ran
# 1.22x faster on nn.Linear and a hidden-1024 one 1.46x faster packed (docs/benchmarks.md). Sizes in
# between were not measured; 512 is where a [64 x 512] x [512 x 512] product (~40 us) starts to dwarf it.
ONEDNN_MIN_HIDDEN = 512


def onednn_available(dtype: torch.dtype) -> bool:
    return (dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """`y = x W^T + b` over a packed W. The packed tensor is not a parameter: the checkpoint's
    tensors were loaded (and fingerprinted) before packing, and nothing trains here."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _PACKING_BATCH_HINT)
        self.bias = linear.bias.detach().clone() if linear.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # inductor cannot lower the packed op over dynamic shapes
            return torch.ops.tokenledger.packed_linear(x, self.packed, self.bias, self.out_features)
        return _linear_rows(x, self.packed, self.bias, self.out_features)


def _linear_rows(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    if x.shape[0] == 0:  # no rows (a middle prefill chunk samples nothing): oneDNN wants M >= 1
        return x.new_empty(0, out_features)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


# The packed matmul as one opaque op, so a compiled graph calls oneDNN as is and fuses around it. Defined
# with the plain operator library, not `torch.library.custom_op`, whose Python wrapper (aliasing checks)
# cost ~20 us a call against ~6 here — 12 linears a forward; eager calls `_linear_rows` directly.
_LIB = torch.library.Library("tokenledger", "FRAGMENT")
_LIB.define("packed_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor")
_LIB.impl("packed_linear", _linear_rows, "CompositeExplicitAutograd")  # the packed weight is an MkldnnCPU tensor


@torch.library.register_fake("tokenledger::packed_linear")
def _packed_linear_shape(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                         out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


def apply_linear_backend(model: nn.Module, backend: str, dtype: torch.dtype, hidden_size: int) -> str:
    """Swaps every `nn.Linear` for a `PackedLinear` when `backend` (auto | onednn | torch, checked by
    ServerArgs) says so — `auto`: where oneDNN runs and the model is large enough to gain from it
    (ONEDNN_MIN_HIDDEN); returns the one in use."""
    available = onednn_available(dtype)
    if backend == "onednn" and not available:
        raise ConfigError("--linear-backend onednn needs float32 weights and torch built with oneDNN (mkldnn)")
    if backend == "torch" or not available or (backend == "auto" and hidden_size < ONEDNN_MIN_HIDDEN):
        return "torch"
    swap_linears(model, PackedLinear)
    return "onednn"


def swap_linears(module: nn.Module, replacement: Callable[[nn.Linear], nn.Module]) -> int:
    """Replaces every `nn.Linear` under `module` by `replacement(linear)`; returns how many it replaced."""
    swapped = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, replacement(child))
            swapped += 1
        else:
            swapped += swap_linears(child, replacement)
    return swapped
