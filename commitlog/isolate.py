"""Run log reads in forked children, so damaged bytes that crash LMDB (SIGBUS, SIGSEGV, SIGABRT)
become a report instead of killing the command, and so a long scan can use every core.

The parent never opens the source LMDB environment itself: each child opens its own after the
fork (LMDB forbids using an environment across fork, and py-lmdb one open per process). Used by
`salvage` here and by every post-mortem command in `ops.logcli`.
"""
from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import lmdb

from commitlog.errors import CommitLogError, CorruptRecordError

TICK_S = 0.1


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str  # ok | corrupt | unreadable | crashed | internal
    value: Any = None
    lsn: int | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        outcome = Outcome("ok", fn(*args))
    except CorruptRecordError as exc:
        outcome = Outcome("corrupt", lsn=exc.lsn, message=exc.detail)
    except (CommitLogError, lmdb.Error, OSError) as exc:
        outcome = Outcome("unreadable", message=str(exc))
    except Exception as exc:  # a bug in the checker must still not surface as a traceback
        outcome = Outcome("internal", message=f"{type(exc).__name__}: {exc}")
    conn.send(outcome)
    conn.close()


def run_isolated(tasks: list[tuple[Callable[..., Any], tuple[Any, ...]]],
                 on_tick: Callable[[], None] | None = None) -> list[Outcome]:
    """Run each (fn, args) in its own forked child at once; outcomes in task order."""
    ctx = multiprocessing.get_context("fork")
    procs, conns = [], []
    for fn, args in tasks:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(send, fn, args), daemon=True)
        proc.start()
        send.close()
        procs.append(proc)
        conns.append(recv)
    outcomes: list[Outcome | None] = [None] * len(tasks)
    pending = set(range(len(tasks)))
    while pending:
        ready = wait([conns[i] for i in pending], timeout=TICK_S)
        for conn in ready:
            i = conns.index(conn)  # type: ignore[arg-type]
            outcomes[i] = _receive(conns[i], procs[i])
            pending.discard(i)
        if on_tick is not None:
            on_tick()
    for proc in procs:
        proc.join()
    return [o for o in outcomes if o is not None]


def _receive(conn: Connection, proc: multiprocessing.process.BaseProcess) -> Outcome:
    try:
        outcome: Outcome = conn.recv()
        return outcome
    except (EOFError, OSError):  # the child died before answering
        proc.join()
        code = proc.exitcode or 0
        name = signal.Signals(-code).name if code < 0 else f"exit status {code}"
        return Outcome("crashed", message=f"the reader process died ({name}) on damaged bytes in the LMDB file")
    finally:
        conn.close()
