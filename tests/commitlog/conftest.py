"""Fixtures for the commit log: ledgers in temp dirs, and a way to 'crash' one in-process."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from commitlog_helpers import FAST

from commitlog import Ledger


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "log"


@pytest.fixture
def ledger(log_dir: Path) -> Iterator[Ledger]:
    led = Ledger.open(log_dir, FAST)
    yield led
    if not led.wal.closed and led.writer.error is None:
        led.close()
