"""tokenledger server: HTTP front, scheduler, model runner, models, KV pools, sampling."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.engine import Engine

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `import server.errors` does not pay for torch.
    if name == "Engine":
        from server.engine import Engine

        return Engine
    raise AttributeError(name)
