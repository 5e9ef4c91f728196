"""The collector and a long-running serving process.

After start-up a process holds ~440,000 objects the cyclic collector tracks (torch, the compiled
graphs, transformers, the model) that live as long as it does. Every full collection scanned them
all: a 275 ms pause once every few seconds under load, the p99 of inter-token and abort latency.
Freezing moves them out of the collector's reach; objects made later are collected as before.
"""
from __future__ import annotations

import gc


def freeze_startup_heap(collect_first: bool = True) -> None:
    """Freezes what is alive now (call once start-up is done). `collect_first` collects start-up's
    garbage before (a full pass, ~0.3 s); an engine that thaws at shutdown may skip it, as garbage
    frozen meanwhile is handed back then."""
    if collect_first:
        gc.collect()
    gc.freeze()


def thaw_heap() -> None:
    """Hands the frozen objects back to the collector: a process that goes on after an engine stops
    (a test run, a notebook) gets the stopped engine's cycles collected."""
    gc.unfreeze()
