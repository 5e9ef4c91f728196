"""tokenledger server: HTTP front, scheduler, model runner, models, KV pools, sampling."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from server.openmp import default_spin_count

if TYPE_CHECKING:
    from server.engine import Engine

__all__ = ["Engine", "SPIN_COUNT_SET_HERE"]

# Before anything here imports torch: libgomp reads its spin count once, when torch loads it (server.openmp).
SPIN_COUNT_SET_HERE = default_spin_count()


def __getattr__(name: str) -> Any:
    # Imported lazily so that `import server.errors` does not pay for torch.
    if name == "Engine":
        from server.engine import Engine

        return Engine
    raise AttributeError(name)
