"""Links every COMMIT/DISCARD to the FORWARD it came from (FORMAT.md, "The schedule").

Results are processed in launch order, and each forward's results come in packed order, one per
member, except for a member that finished while the result was pending (skipped, unlogged). So
a result belongs to the oldest pending forward that lists its request after the last matched
member; members passed over, and a forward left behind, must be finished by then. Members are
told apart by incarnation (the BEGIN LSN), as a rid may be used again once it has finished.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from commitlog.codec import Kind

UNKNOWN_BEGIN = -1  # the request began before the checked range: its incarnation is not known here
Member = tuple[str, int]  # rid, BEGIN LSN of the incarnation (UNKNOWN_BEGIN when not known)


@dataclass(slots=True)
class PendingForward:
    lsn: int
    seq: int
    members: list[Member]
    next: int = 0  # members before this one are matched or passed over


@dataclass(frozen=True, slots=True)
class LinkProblem:
    lsn: int
    rid: str | None
    message: str


class ResultLinker:
    """Feed FORWARD records and results in LSN order. `is_finished(member)` says whether that
    incarnation has its FINISH by now (True when it cannot be known, e.g. it began before the range).

    `synced` is False until the pending queue is known: from a SERVER_START, or a FORWARD launched
    with nothing pending (`q` 0). A range that starts mid-log checks nothing before that point."""

    def __init__(self, is_finished: Callable[[Member], bool], synced: bool = False) -> None:
        self._is_finished = is_finished
        self.synced = synced
        self.pending: deque[PendingForward] = deque()
        self.problems: list[LinkProblem] = []
        self.num_linked = 0

    def server_start(self, logs_schedule: bool) -> None:
        """A new instance: nothing launched before it can still deliver a result. An instance from
        before the schedule was logged (no `engine` in its SERVER_START) has no FORWARDs to check."""
        self.pending.clear()
        self.synced = logs_schedule

    def forward(self, lsn: int, seq: int, pending: int, members: list[Member]) -> None:
        if pending == 0:
            if self.synced:
                self._drain_all(lsn)
            self.pending.clear()
            self.synced = True
        self.pending.append(PendingForward(lsn, seq, members))

    def result(self, lsn: int, member: Member, kind: str) -> PendingForward | None:
        """The forward this result belongs to, or None (a problem is recorded when synced)."""
        if not self.synced:
            return None
        while self.pending:
            head = self.pending[0]
            at = _find(head, member)
            if at is not None:
                self._passed_over(head, at, lsn)
                head.next = at + 1
                self.num_linked += 1
                return head
            self._passed_over(head, len(head.members), lsn)
            self.pending.popleft()
        self.problems.append(LinkProblem(lsn, member[0], f"{kind} of {member[0]!r} belongs to no logged forward "
                                                         "(none pending lists it): a result without a launch"))
        return None

    def _drain_all(self, lsn: int) -> None:
        # A launch with nothing pending: every earlier forward's results are in.
        while self.pending:
            head = self.pending.popleft()
            self._passed_over(head, len(head.members), lsn)

    def _passed_over(self, head: PendingForward, stop: int, lsn: int) -> None:
        for rid, begin in head.members[head.next:stop]:
            if not self._is_finished((rid, begin)):
                self.problems.append(LinkProblem(lsn, rid, f"forward {head.seq} (LSN {head.lsn}) has no result for "
                                                           f"{rid!r}, which had not finished: a result is missing"))
        head.next = max(head.next, stop)


def _find(head: PendingForward, member: Member) -> int | None:
    rid, begin = member
    for i in range(head.next, len(head.members)):
        m_rid, m_begin = head.members[i]
        if m_rid == rid and (m_begin == begin or UNKNOWN_BEGIN in (m_begin, begin)):
            return i
    return None


class CheckedRequest(Protocol):
    """What `verify`'s per-request checks know (ops.logcli.invariants.ReqCheck)."""

    begin_lsn: int
    abort_lsn: int | None
    finish_lsn: int | None


AddViolation = Callable[[int, "str | None", str, str], None]


class ScheduleCheck:
    """`verify`'s schedule checks over one range: FORWARD records against the requests they list
    (I2: no launch after an abort), and every result linked to its forward."""

    def __init__(self, reqs: Mapping[str, CheckedRequest], add: AddViolation) -> None:
        self._reqs = reqs  # the range's requests by rid, the latest incarnation of each
        self._add = add
        self.linker = ResultLinker(self._finished)

    def forward(self, lsn: int, seq: int, pending: int, rids: tuple[str, ...]) -> None:
        members: list[Member] = []
        for rid in rids:
            req = self._reqs.get(rid)
            if req is not None and req.finish_lsn is not None:
                self._add(lsn, rid, "schedule", f"forward {seq} launched with the request finished "
                                                f"(FINISH at LSN {req.finish_lsn})")
            elif req is not None and req.abort_lsn is not None:
                self._add(lsn, rid, "I2", f"forward {seq} launched after ABORT_REQUESTED at LSN {req.abort_lsn}")
            members.append((rid, req.begin_lsn if req is not None else UNKNOWN_BEGIN))
        self.linker.forward(lsn, seq, pending, members)
        self._report()

    def result(self, lsn: int, kind: int, rid: str) -> None:
        req = self._reqs.get(rid)
        self.linker.result(lsn, (rid, req.begin_lsn if req is not None else UNKNOWN_BEGIN), Kind(kind).name)
        self._report()

    def _report(self) -> None:
        for problem in self.linker.problems:
            self._add(problem.lsn, problem.rid, "schedule", problem.message)
        self.linker.problems.clear()

    def _finished(self, member: Member) -> bool:
        rid, begin = member
        req = self._reqs.get(rid)
        if req is None or begin == UNKNOWN_BEGIN or req.begin_lsn != begin:
            return True  # began before this range (not known here), or a later incarnation has begun
        return req.finish_lsn is not None
