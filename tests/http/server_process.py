"""Starts the real `tokenledger serve` in its own process on a free port, for end-to-end tests."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(self, model_dir: Path, log_dir: Path, *extra: str) -> None:
        self.port = free_port()
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr_path = log_dir.parent / f"serve-{self.port}.stderr"
        cmd = [sys.executable, "-m", "ops.cli", "serve", "--model-path", str(model_dir), "--port", str(self.port),
               "--log-dir", str(log_dir), "--max-total-tokens", "16384", "--max-running-requests", "64",
               "--chunked-prefill-size", "64", *extra]
        # Its own process group, so a test can kill -9 the front and the scheduler together.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.stderr_path, "a"),
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.stderr()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy: {self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def terminate(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill_all(self) -> None:
        """kill -9 of the whole server: front and scheduler, no chance to write anything."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        # The scheduler is gone once nobody holds the log's writer lock any more.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.system(f"pgrep -g {self.proc.pid} > /dev/null") == 0:
            time.sleep(0.05)
