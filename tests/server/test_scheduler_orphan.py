"""kill -9 of the front must not leave the scheduler running as an orphan that holds the log's
writer lock (issue 10 E.18): it aborts what runs (logged), writes SERVER_STOP and exits."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "http"))
from server_process import ServerProcess  # noqa: E402

from commitlog import Kind, LogReader  # noqa: E402

EXIT_WITHIN_S = 10.0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(p) for p in text)
    return out


def _scheduler_pid(front_pid: int) -> int:
    """The front's spawned child running the scheduler (not multiprocessing's resource tracker)."""
    for pid in _children(front_pid):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmdline:
            return pid
    raise AssertionError(f"no scheduler child of {front_pid}: {_children(front_pid)}")


def _gone(pid: int) -> bool:
    """Exited: no /proc entry, or a zombie nobody has reaped yet (it holds no lock and no file)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _stream_until_first_token(url: str, started: threading.Event) -> None:
    body = {"input_ids": [5, 6, 7, 8], "rid": "long", "stream": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0}}
    try:
        with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    started.set()
    except (httpx.HTTPError, OSError):
        pass  # the front is killed mid-stream


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ops.logcli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_e18_scheduler_closes_the_log_and_exits_when_the_front_is_killed(tiny_checkpoint, tmp_path):
    log = tmp_path / "log"
    srv = ServerProcess(tiny_checkpoint("llama"), log)
    srv.wait_healthy()
    sched = _scheduler_pid(srv.proc.pid)
    try:
        started = threading.Event()
        client = threading.Thread(target=_stream_until_first_token, args=(srv.url, started), daemon=True)
        client.start()
        assert started.wait(60), srv.stderr()
        os.kill(srv.proc.pid, signal.SIGKILL)  # the front only: no drain, no ShutdownMsg
        srv.proc.wait(30)
        deadline = time.monotonic() + EXIT_WITHIN_S
        while time.monotonic() < deadline and not _gone(sched):
            time.sleep(0.05)
        assert _gone(sched), f"the scheduler (pid {sched}) still runs {EXIT_WITHIN_S}s after its front died"
    finally:
        if not _gone(sched):
            os.kill(sched, signal.SIGKILL)
    client.join(10)
    assert "front_gone" in srv.stderr()
    verify = _cli("verify", "--log-dir", str(log), "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    reader = LogReader.open(log)
    try:
        last = next(iter(reader.records(reader.last_lsn())))
        long = reader.request_records("long")
    finally:
        reader.close()
    assert last.kind is Kind.SERVER_STOP  # closed, not crashed: the next start has nothing to recover
    assert long[-1].kind is Kind.FINISH and long[-1].payload["reason"] == "abort"
    abort = next(r for r in long if r.kind is Kind.ABORT_REQUESTED)
    assert abort.payload["source"] == "shutdown" and "front process is gone" in abort.payload["reason"]
    audit = _cli("audit", "--log-dir", str(log), "--rid", "long", "--json")
    row = json.loads(audit.stdout.splitlines()[0])
    assert audit.returncode == 0 and row["status"] == "aborted" and row["abort_source"] == "shutdown", audit.stdout
    again = ServerProcess(tiny_checkpoint("llama"), log)  # the writer lock is free: a restart is accepted
    try:
        again.wait_healthy(120)
    finally:
        assert again.terminate() == 0, again.stderr()
