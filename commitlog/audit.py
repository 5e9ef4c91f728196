"""The log's account of one request: what it was sent, what it was shown, how it ended.

`audit_request(reader, rid)` is what `GET /requests/{rid}` and `tokenledger audit` print;
`iter_audits` walks a whole log once. Built by replaying records (`commitlog.state`), so
it is exactly what the server committed (I6). No torch, no server.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from commitlog.codec import Kind, Record
from commitlog.reader import LogReader
from commitlog.state import FinishReason, RequestState, apply_record, state_from_begin


class RecordSource(Protocol):
    """Where a whole-log walk reads records: a LogReader, or the CLI's crash-isolated log."""

    def records(self, start: int = 1, end: int | None = None) -> Iterator[Record]: ...


STATUSES = ("running", "finished", "aborted", "interrupted")
_STATUS_OF = {FinishReason.STOP: "finished", FinishReason.LENGTH: "finished",
              FinishReason.ABORT: "aborted", FinishReason.INTERRUPTED: "interrupted"}


def iso_time(ns: int | None) -> str | None:
    """UTC, microseconds, RFC 3339 (`2025-01-31T23:59:59.123456Z`)."""
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def finish_reason_object(state: RequestState) -> dict[str, Any] | None:
    """SGLang's `finish_reason` object, as the server returned it for this request."""
    reason = state.finish_reason
    if reason is None:
        return None
    out: dict[str, Any] = {"type": reason.value}
    if reason is FinishReason.STOP:
        out["matched"] = state.finish_matched
    elif reason is FinishReason.LENGTH:
        out["length"] = state.finish_matched
    elif reason is FinishReason.ABORT:
        # An abort the server decided itself (a grammar that rejected a token) logs its reason as `matched`.
        matched = state.finish_matched if isinstance(state.finish_matched, str) else None
        out["message"] = state.doom_reason or matched or "aborted"
    return out


@dataclass(slots=True)
class RequestAudit:
    """One request as the log has it. `to_dict()` is the JSON object `audit` prints."""

    rid: str
    status: str  # running | finished | aborted | interrupted
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    output_ids: list[int]
    output_logprobs: list[float]
    begin_time: str | None
    finish_time: str | None
    abort_source: str | None
    abort_reason: str | None
    abort_time: str | None
    discarded_results: int
    discard_reasons: list[str]
    num_commits: int
    kv_committed_len: int
    sampling_params: dict[str, Any]
    begin_lsn: int
    last_lsn: int
    abort_lsn: int | None
    finish_lsn: int | None
    finish_logged: bool  # False: no FINISH record (running, or a crash nobody has recovered yet)
    incarnation: int = 1  # 1 for a rid's first BEGIN in the log, 2 when the rid was used again, ...
    cached_tokens: int = 0  # prompt tokens whose KV the prefix cache supplied
    begin_ns: int = field(default=0, repr=False)
    # Prompt logprobs, from logprob_start_len (position 0, which has no context, is never scored).
    input_logprobs: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["begin_ns"]
        return out


@dataclass(slots=True)
class _Trail:
    """A request being replayed, plus where its records sit in the log."""

    state: RequestState
    begin: Record
    last_lsn: int
    incarnation: int = 1
    abort_lsn: int | None = None
    finish: Record | None = None

    def apply(self, record: Record) -> None:
        apply_record(self.state, record)
        self.last_lsn = record.lsn
        if record.kind is Kind.ABORT_REQUESTED:
            self.abort_lsn = self.abort_lsn or record.lsn
        elif record.kind is Kind.FINISH:
            self.finish = record

    def audit(self, writer_alive: bool) -> RequestAudit:
        s = self.state
        finish = finish_reason_object(s)
        status = _STATUS_OF[s.finish_reason] if s.finish_reason is not None else "running"
        if self.finish is None and not writer_alive:
            status, finish = "interrupted", {"type": FinishReason.INTERRUPTED.value}
        return RequestAudit(
            s.rid, status, finish, len(s.prompt_ids), len(s.output_ids), list(s.output_ids),
            list(s.output_logprobs), iso_time(self.begin.ts_ns), iso_time(self.finish.ts_ns if self.finish else None),
            s.doom_source.value if s.doom_source else None, s.doom_reason, iso_time(s.abort_time_ns),
            len(s.discards), list(s.discards), s.num_commits, s.kv_committed_len, dict(s.sampling_params),
            self.begin.lsn, self.last_lsn, self.abort_lsn, self.finish.lsn if self.finish else None,
            self.finish is not None, self.incarnation, s.cached_tokens, self.begin.ts_ns, list(s.input_logprobs))


def audit_incarnations(records: Iterable[Record], writer_alive: bool = True) -> list[RequestAudit]:
    """One audit per BEGIN in a rid's records (LSN order): a rid used again after it finished has
    several incarnations, each its own account (issue 10 C.14)."""
    trails: list[_Trail] = []
    for record in records:
        if record.kind is Kind.BEGIN:
            trails.append(_Trail(state_from_begin(record), record, record.lsn, len(trails) + 1))
        elif trails:
            trails[-1].apply(record)
    return [trail.audit(writer_alive) for trail in trails]


def audit_records(records: Iterable[Record], writer_alive: bool = True) -> RequestAudit | None:
    """The latest incarnation's audit from a rid's records in LSN order; None without a BEGIN."""
    audits = audit_incarnations(records, writer_alive)
    return audits[-1] if audits else None


def audit_request(reader: LogReader, rid: str, writer_alive: bool = True,
                  incarnation: int | None = None) -> dict[str, Any] | None:
    """The JSON object for `GET /requests/{rid}`; None when the log has no such request.

    The latest incarnation by default (its `incarnation` field says how many came before), or the
    one numbered `incarnation` (1-based). `writer_alive=False` (a crashed server's log, not yet
    reopened) reports a request with no FINISH as `interrupted` instead of `running`.
    """
    audits = audit_incarnations(reader.request_records(rid), writer_alive)
    if incarnation is not None:
        audits = [a for a in audits if a.incarnation == incarnation]
    return audits[-1].to_dict() if audits else None


def iter_audits(reader: RecordSource, until_lsn: int | None = None, writer_alive: bool = True,
                progress: Callable[[int], None] | None = None) -> Iterator[RequestAudit]:
    """Every request in one pass: finished ones as their FINISH is read, then the rest in BEGIN order.

    With `until_lsn`, the log as it stood then: requests not finished by that LSN are `running`.
    """
    for audit, _state in iter_audit_states(reader, until_lsn, writer_alive, progress):
        yield audit


def iter_audit_states(reader: RecordSource, until_lsn: int | None = None, writer_alive: bool = True,
                      progress: Callable[[int], None] | None = None) -> Iterator[tuple[RequestAudit, RequestState]]:
    """`iter_audits` with each request's full replayed state (top logprobs, hidden states...)."""
    open_trails: dict[str, _Trail] = {}
    begun: dict[str, int] = {}  # BEGINs seen per rid: numbers each incarnation as `audit_incarnations` does
    alive = writer_alive or until_lsn is not None
    for n, record in enumerate(reader.records(1, until_lsn), 1):
        if progress is not None and n % 4096 == 0:
            progress(record.lsn)
        if record.rid is None:
            continue
        if record.kind is Kind.BEGIN:
            begun[record.rid] = begun.get(record.rid, 0) + 1
            open_trails[record.rid] = _Trail(state_from_begin(record), record, record.lsn, begun[record.rid])
            continue
        trail = open_trails.get(record.rid)
        if trail is None:
            continue  # its BEGIN was lost (salvage); `verify` reports it
        trail.apply(record)
        if record.kind is Kind.FINISH:
            del open_trails[record.rid]
            yield trail.audit(alive), trail.state
    for trail in open_trails.values():
        yield trail.audit(alive), trail.state


def writer_alive(log_dir: str | os.PathLike[str]) -> bool:
    """Whether a process holds the log's writer lock (an flock on the log directory, see
    `commitlog.wal._take_writer_lock`), read from /proc/locks without touching the lock (taking it,
    even shared, could make a starting server fail)."""
    try:
        st = Path(log_dir).stat()
    except OSError:
        return False  # no such log
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return True  # cannot tell: call nothing interrupted that may still be running
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(len(p) > 5 and p[1] == "FLOCK" and p[5] == ident for p in (line.split() for line in lines))
