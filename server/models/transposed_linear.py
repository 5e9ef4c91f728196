"""A linear layer over its weight stored transposed, `[in, out]` and contiguous, for the compiled trunk.

`nn.Linear` hands MKL `x @ W^T` over the checkpoint's `[out, in]` weight. For the few rows of a decode
step MKL runs the plain `x @ Wt` over a contiguous `[in, out]` copy faster: on the tiny Llama (hidden
128), one decode step's four trunk matmuls took 234 -> 177 µs at 26 rows and 335 -> 264 µs at 48
(docs/benchmarks.md, seventeenth session). The two layouts sum in the same order from a few rows on, but
MKL's matrix-vector path for one to three rows rounds differently, so only the compiled trunk — which
already agrees with eager to float rounding, not bit for bit — uses it; eager keeps `nn.Linear`, whose
bits HF parity pins.
"""
from __future__ import annotations

import torch
from torch import nn

from server.models.packed_linear import swap_linears


class TransposedLinear(nn.Module):
    """`y = x Wt + b` with `Wt = W^T` copied once. Like `PackedLinear`, the copy is a buffer, not a
    parameter: the checkpoint's tensors were loaded and fingerprinted before, and nothing trains here."""

    weight_t: torch.Tensor

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous(), persistent=False)
        self.bias = linear.bias.detach().clone() if linear.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Inductor folds the bias (and a residual added to the result) into one addmm.
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def transpose_linears(module: nn.Module) -> int:
    """Swaps every `nn.Linear` under `module` for a `TransposedLinear`; returns how many."""
    return swap_linears(module, TransposedLinear)
