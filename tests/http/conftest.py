from __future__ import annotations

import pytest
from server_process import ServerProcess


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    proc = ServerProcess(tiny_checkpoint("llama"), tmp_path_factory.mktemp("http") / "log",
                         "--log-requests", "--log-requests-level", "3", "--log-format", "json")
    proc.wait_healthy()
    yield proc
    assert proc.terminate() == 0, proc.stderr()
