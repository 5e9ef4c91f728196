"""The C kernels an engine runs, each by its build: what SERVER_START records as `engine.kernels` and
what `replay --reexecute` compares with the builds it runs itself. A divergence on another build (another
compiler, other flags, a CPU without AVX-512) says nothing about the log."""
from __future__ import annotations

from collections.abc import Callable


def _builders() -> dict[str, Callable[[], str | None]]:
    from kernels import cpu_attention, row_gather

    return {cpu_attention.SOURCE: cpu_attention.kernel_build, row_gather.SOURCE: row_gather.library_build}


def engine_builds(attention_backend: str, device_type: str) -> dict[str, str]:
    """Source file -> build id of the C kernels an engine with this attention backend (its resolved name)
    runs on this device type: the attention kernel for `cpu`, the batch-layout gather for any CPU table.
    Empty off the CPU (device kernels are torch's, Triton's or FlashInfer's: `software` names them)."""
    if device_type != "cpu":
        return {}
    from kernels import cpu_attention, row_gather

    wanted = [row_gather.SOURCE] + ([cpu_attention.SOURCE] if attention_backend == "cpu" else [])
    return current_builds(wanted)


def current_builds(sources: list[str]) -> dict[str, str]:
    """Source file -> the build this machine runs of it (sources it cannot build, or does not know, left out)."""
    builders = _builders()
    found = {s: builders[s]() if s in builders else None for s in sources}
    return {s: b for s, b in found.items() if b is not None}
