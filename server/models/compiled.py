"""The model's trunk (embedding, layers, final norm) compiled by inductor on CPU, with an eager fallback.

On a small model most of a decode step is not matmuls but the dozens of small elementwise ops around
them (norms, rotary, SiLU, residual adds, the K/V stores), each a separate eager kernel launch with its
own pass over memory. Inductor fuses them into a few C++ loops and calls the oneDNN matmuls and the C
attention kernel as opaque ops (`tokenledger::packed_linear`, `tokenledger::cpu_paged_attention`), so
their numerics are the eager path's. The fused elementwise ops sum in a different order than eager's, so
compiled and eager outputs agree to float rounding, not bit for bit: the log records which ran
(SERVER_START's `compiled`) and `replay --reexecute` rebuilds the same one.

Shapes are dynamic (one graph serves every batch size and token count; torch specialises size 1, so a
one-token forward has its own graph). `warm_up` compiles those graphs at start-up over the padding slot
0, which no request owns, so the first requests do not wait for the compiler and no request's KV changes.
"""
from __future__ import annotations

import os

import torch

from kernels.backend import AttentionBackend, BatchLayout
from server.errors import ConfigError
from server.models.causal_lm import CausalLM
from server.models.transposed_linear import transpose_linears

COMPILE_MODES = ("auto", "on", "off")
# What `auto` means where it is not given on the command line: the test suite sets it to off, because
# compiling costs seconds per engine and the suite builds hundreds (the compiled path has its own tests).
AUTO_ENV = "TOKENLEDGER_TORCH_COMPILE"
INDUCTOR = "inductor"  # CausalLM.compiled once compiled (it starts as "eager")
# The warm-up forwards, as (new tokens, KV length) per request: one token over a longer KV (batch-1
# decode), one token over a KV of one (a one-token prompt: torch specialises a size-1 KV too), and
# several requests with several tokens each (every other batch).
# Lengths unlike any model dimension, so no guard equates them.
_WARM_UP_BATCHES = (((1, 11),), ((1, 1),), ((3, 13), (2, 17)))


def wants_compile(mode: str, device: torch.device, dtype: torch.dtype, attention: AttentionBackend) -> bool:
    """`on` where it can run (else a ConfigError that says why), `off` never, `auto` where it wins:
    CPU, fp32 and the C attention kernel — unless TOKENLEDGER_TORCH_COMPILE=off says otherwise."""
    if mode == "auto":
        mode = os.environ.get(AUTO_ENV, "auto")
        if mode not in COMPILE_MODES:
            raise ConfigError(f"{AUTO_ENV} must be one of {', '.join(COMPILE_MODES)}, not {mode!r}")
    if mode == "off":
        return False
    runs = device.type == "cpu" and dtype == torch.float32 and attention.name == "cpu"
    if mode == "on" and not runs:
        raise ConfigError("--torch-compile on compiles the trunk around the C attention kernel: it needs "
                          f"--device cpu, --dtype float32 and --attention-backend cpu or auto (here: {device.type}, "
                          f"{dtype}, attention {attention.name}); use --torch-compile off")
    return runs


def compile_trunk(model: CausalLM) -> None:
    """Replaces the model's `trunk` by its inductor-compiled self (the first call of each shape class compiles).
    The layers' `nn.Linear`s become `TransposedLinear`s first (oneDNN's packed ones stay as they are); the
    LM head, which runs eager, keeps its layout."""
    import torch._dynamo.config
    import torch.fx.experimental._config
    # Without this, sizes that happen to be equal when a graph is traced (a batch's KV length and the
    # model's head count, say) are guarded as equal, and the next batch recompiles for seconds.
    torch.fx.experimental._config.use_duck_shape = False
    # Dynamo keeps at most `recompile_limit` graphs per function; every model shape and linear backend a
    # process compiles adds two (a server has one model; tests and benchmarks build several engines).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    transpose_linears(model.model.layers)
    model.trunk = torch.compile(model.trunk, dynamic=True, fullgraph=True)  # type: ignore[method-assign]
    model.compiled = INDUCTOR


def warm_up(model: CausalLM, attention: AttentionBackend) -> None:
    """Runs the compiled trunk once per shape class over slot 0 (the padding slot no request owns).
    The index tensors are made outside inference mode, as the batch builder's are: the graphs are
    guarded on that too."""
    device = model.model.embed_tokens.weight.device
    for batch in _WARM_UP_BATCHES:
        new, kv = [n for n, _ in batch], [k for _, k in batch]

        def indptr(lens: list[int]) -> torch.Tensor:
            return torch.tensor([0, *lens], dtype=torch.int64, device=device).cumsum(0)

        layout = BatchLayout(torch.zeros(sum(new), dtype=torch.int64, device=device), indptr(new), indptr(kv),
                             torch.zeros(sum(kv), dtype=torch.int64, device=device), all(n == 1 for n in new), max(kv))
        positions = torch.cat([torch.arange(k - n, k, device=device) for n, k in batch])
        ids = torch.zeros(sum(new), dtype=torch.int64, device=device)
        with torch.inference_mode():  # as ModelRunner plans and runs a forward
            model(ids, positions, attention.plan(layout), max(kv))
