"""A real SchedulerProcess run in the test's own process, its sender thread swapped for a list,
so a test can hand it messages one by one and read what it would send to the front."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from server.config import ServerArgs
from server.messages import GenerateMsg
from server.request import LogprobRequest, RequestSpec
from server.sampling.params import SamplingParams
from server.scheduler_process import SchedulerProcess


class CollectingSender:
    """Stands in for the sender thread: keeps what the scheduler would send to the front."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, msg: object) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        pass


@contextmanager
def inproc_scheduler(model_dir: Path, log_dir: Path, sock_dir: Path) -> Iterator[SchedulerProcess]:
    """Yields the process; on exit its log is closed (if the test has not) and its ZMQ context
    ended — a context left with an open socket hangs the interpreter in `term()`."""
    proc = SchedulerProcess(ServerArgs(model_path=str(model_dir)), log_dir, f"ipc://{sock_dir}/in",
                            f"ipc://{sock_dir}/out")
    proc.sender.close()
    proc.sender = CollectingSender()  # type: ignore[assignment]
    try:
        yield proc
    finally:
        if not proc.sched.ledger.wal.closed:
            proc.sched.ledger.close()
        proc.inbound.close(linger=0)
        proc.ctx.term()


def generate_msg(rid: str, sampling: dict[str, Any], prompt: list[int] | None = None) -> GenerateMsg:
    """What the front sends for one request (seed fixed, so runs repeat)."""
    spec = RequestSpec(rid, prompt or [5, 6, 7], SamplingParams.from_dict(sampling | {"seed": 1}), LogprobRequest())
    return GenerateMsg.from_spec(spec)
