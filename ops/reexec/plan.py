"""The log read as a script: per server instance, its engine settings and, in LSN order, the
events re-execution replays (arrivals, launches, result processing, aborts), each forward with
the logged outcome of every member. Torch-free: it only reads records.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from commitlog import CorruptRecordError, Kind, Record
from commitlog.schedule import Forward
from ops.logcli.linkage import Member, ResultLinker


@dataclass(slots=True)
class LoggedRequest:
    """One incarnation of a rid: its BEGIN and every later record of it, in LSN order."""

    rid: str
    begin_lsn: int
    incarnation: int  # 1-based among the log's BEGINs of this rid
    prompt: list[int]
    params: dict[str, Any]
    grammar: str | None
    records: list[Record] = field(default_factory=list)
    first_prefix: int | None = None  # KV tokens held before its first extend: > 0 is a prefix-cache hit
    excluded: str | None = None  # why it cannot be re-executed, when it cannot

    @property
    def key(self) -> Member:
        return self.rid, self.begin_lsn

    @property
    def is_finished(self) -> bool:
        return any(r.kind is Kind.FINISH for r in self.records)


@dataclass(slots=True)
class PlannedForward:
    lsn: int
    forward: Forward
    members: list[LoggedRequest]  # in packed order, one per segment
    outcomes: list[Record | None]  # the member's COMMIT/DISCARD, None: skipped (it finished first)


class EventKind(enum.Enum):
    BEGIN = "begin"
    LAUNCH = "launch"
    PROCESS = "process"  # results of forwards up to this one were processed here
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    request: LoggedRequest | None = None
    forward: PlannedForward | None = None
    record: Record | None = None  # ABORT_REQUESTED


@dataclass(slots=True)
class Instance:
    """One SERVER_START and what followed it up to the next one."""

    start_lsn: int | None  # None: its SERVER_START is not in the log
    fingerprint: str
    engine: dict[str, Any] | None  # None: written before the schedule was logged
    tokenizer_dir: str | None
    events: list[Event] = field(default_factory=list)
    requests: list[LoggedRequest] = field(default_factory=list)
    forwards: list[PlannedForward] = field(default_factory=list)


class _Builder:
    def __init__(self) -> None:
        self.instances: list[Instance] = []
        self.live: dict[str, LoggedRequest] = {}
        self.seen: dict[str, int] = {}
        self.by_key: dict[Member, LoggedRequest] = {}
        self.linker = ResultLinker(self._finished)

    def _finished(self, member: Member) -> bool:
        req = self.by_key.get(member)
        return req is None or req.is_finished

    def feed(self, record: Record) -> None:
        kind = record.kind
        if kind is Kind.SERVER_START:
            engine = record.payload.get("engine")
            p = record.payload
            self.instances.append(Instance(record.lsn, str(p.get("fingerprint", "")), engine, p.get("tokenizer_dir")))
            self.linker.server_start(engine is not None)
        elif kind is Kind.FORWARD:
            if self.instances and self.instances[-1].engine is not None:
                self._forward(record)  # else nothing can be re-run, and a salvage may have lost members
        elif record.rid is not None:
            if not self.instances:  # retention (or a salvage) dropped this instance's SERVER_START
                self.instances.append(Instance(None, "", None, None))
            self._request_record(record)

    def _forward(self, record: Record) -> None:
        forward = Forward.from_payload(record.payload, record.lsn)
        members = []
        for seg in forward.segments:
            req = self.live.get(seg.rid)
            if req is None:
                raise CorruptRecordError(f"FORWARD {forward.seq} lists {seg.rid!r}, which is not running", record.lsn)
            if req.first_prefix is None:
                req.first_prefix = seg.prefix
            members.append(req)
        planned = PlannedForward(record.lsn, forward, members, [None] * len(members))
        self.instances[-1].forwards.append(planned)
        self.instances[-1].events.append(Event(EventKind.LAUNCH, forward=planned))
        self.linker.forward(record.lsn, len(self.instances[-1].forwards) - 1, forward.pending,
                            [m.key for m in members])

    def _request_record(self, record: Record) -> None:
        assert record.rid is not None
        if record.kind is Kind.BEGIN:
            self._begin(record)
            return
        req = self.live.get(record.rid)
        if req is None:
            return  # began before this log's first record (retention): not re-executable, not listed
        if record.kind in (Kind.COMMIT, Kind.DISCARD):
            self._result(record, req)
        elif record.kind is Kind.ABORT_REQUESTED:
            self.instances[-1].events.append(Event(EventKind.ABORT, request=req, record=record))
        req.records.append(record)
        if record.kind is Kind.FINISH:
            del self.live[record.rid]

    def _begin(self, record: Record) -> None:
        assert record.rid is not None
        p = record.payload
        self.seen[record.rid] = self.seen.get(record.rid, 0) + 1
        req = LoggedRequest(record.rid, record.lsn, self.seen[record.rid], list(p["prompt"]), dict(p["params"]),
                            p["grammar"])
        self.live[record.rid] = self.by_key[req.key] = req
        self.instances[-1].requests.append(req)
        self.instances[-1].events.append(Event(EventKind.BEGIN, request=req))

    def _result(self, record: Record, req: LoggedRequest) -> None:
        pending = self.linker.result(record.lsn, req.key, record.kind.name)
        if pending is None:
            if self.linker.synced:
                raise CorruptRecordError(f"{record.kind.name} of {req.rid!r} belongs to no logged forward", record.lsn)
            return
        planned = self.instances[-1].forwards[pending.seq]
        planned.outcomes[pending.next - 1] = record
        events = self.instances[-1].events
        if not (events[-1].kind is EventKind.PROCESS and events[-1].forward is planned):
            events.append(Event(EventKind.PROCESS, forward=planned))


def build_plan(records: Iterable[Record]) -> list[Instance]:
    """The log as re-execution replays it. CorruptRecordError when the schedule and results disagree."""
    builder = _Builder()
    for record in records:
        builder.feed(record)
    for instance in builder.instances:
        _exclude(instance)
    return builder.instances


def _exclude(instance: Instance) -> None:
    """Marks what cannot be re-executed at all."""
    for req in instance.requests:
        if instance.engine is None and instance.start_lsn is None:
            req.excluded = "its server's SERVER_START is not in the log (dropped by retention, or lost in a salvage)"
        elif instance.engine is None:
            req.excluded = "logged by a server that did not record its schedule"


def spread_exclusions(instance: Instance) -> None:
    """A forward's numerics depend on all its members: re-run in the logged batches, a request that
    shares a forward with an excluded one cannot be proven either (to a fixed point)."""
    changed = True
    while changed:
        changed = False
        for planned in instance.forwards:
            tainted = next((m for m in planned.members if m.excluded), None)
            if tainted is None:
                continue
            for m in planned.members:
                if not m.excluded:
                    m.excluded, changed = f"shares forward {planned.forward.seq} with {tainted.rid!r} ({tainted.excluded})", True
