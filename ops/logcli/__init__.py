"""The post-mortem commands over a commit log: verify, replay, audit, export, salvage.

They read the log only (read-only LMDB, safe beside a running server) and need neither the
model nor torch; `python -m ops.logcli` runs them without loading the serving stack.
"""
from __future__ import annotations

import argparse

from ops.logcli import audit, export, replay, salvage_cmd, verify


def add_parsers(sub: argparse._SubParsersAction) -> None:
    for module in (verify, replay, audit, export, salvage_cmd):
        module.add_parser(sub)
