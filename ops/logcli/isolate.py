"""Crash-isolated log reads for the post-mortem commands; the mechanism lives in `commitlog.isolate`
(salvage, in `commitlog`, needs it too)."""
from __future__ import annotations

from commitlog.isolate import Outcome, run_isolated

__all__ = ["Outcome", "run_isolated"]
