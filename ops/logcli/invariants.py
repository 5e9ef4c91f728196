"""The log's invariants checked record by record over one LSN range (DESIGN I2, I6, I7).

Ranges are checked in parallel, so a request that began in an earlier range arrives here as
"carried" records: they are kept as small facts and replayed onto its state by `merge`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from commitlog.codec import Kind, pack_lsns

MAX_VIOLATIONS = 1000  # per range: enough to act on, bounded for a log that is wrong everywhere
# Plain ints: comparing an int with an IntEnum member takes the slower subclass path, per record.
_COMMIT, _DISCARD, _ABORT, _FINISH, _BEGIN = (int(k) for k in (Kind.COMMIT, Kind.DISCARD, Kind.ABORT_REQUESTED,
                                                                Kind.FINISH, Kind.BEGIN))
_SERVER_KINDS = frozenset(int(k) for k in (Kind.SERVER_START, Kind.SERVER_STOP, Kind.RECOVERED, Kind.CHECKPOINT))
_EMPTY: tuple[Any, ...] = ()
Fact = tuple[int, int, tuple[Any, ...]]  # lsn, kind, what the checks need from the payload
Incarnation = tuple[str, int, int, bytes]  # rid, BEGIN LSN, number of records, lsn_digest of their LSNs


def lsn_digest(lsns: list[int]) -> bytes:
    """What the index must hold for one finished incarnation, in 16 bytes: ranges send these, not LSN lists."""
    return hashlib.blake2b(pack_lsns(lsns), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Violation:
    lsn: int
    rid: str | None
    check: str  # the invariant: I2, I6, I7, state, watermark, lengths, format, chain, head
    message: str


@dataclass(slots=True)
class ReqCheck:
    """What the checks remember of one request."""

    rid: str
    begin_lsn: int
    num_out: int = 0
    num_logprobs: int = 0
    watermark: int = 0
    abort_lsn: int | None = None
    fin_commit: str | None = None  # the reason a finishing COMMIT carried
    finish_lsn: int | None = None
    finish_reason: str | None = None
    lsns: list[int] = field(default_factory=list)  # this incarnation's records, for the index check

    def incarnation(self) -> Incarnation:
        return self.rid, self.begin_lsn, len(self.lsns), lsn_digest(self.lsns)


@dataclass(slots=True)
class Carried:
    """Records of a request that began before this range, up to its next BEGIN here if any."""

    facts: list[Fact] = field(default_factory=list)
    next_begin: int | None = None


@dataclass(slots=True)
class Violations:
    items: list[Violation] = field(default_factory=list)
    count: int = 0

    def add(self, lsn: int, rid: str | None, check: str, message: str) -> None:
        self.count += 1
        if len(self.items) < MAX_VIOLATIONS:
            self.items.append(Violation(lsn, rid, check, message))


def payload_fact(kind: int, p: dict[str, Any]) -> tuple[Any, ...]:
    """The few payload fields the checks read; KeyError/TypeError mean a malformed payload."""
    if kind == _COMMIT:
        fin, wm = p["fin"], p["wm"]
        if wm is not None and wm.__class__ is not int:
            raise TypeError(f"watermark {wm!r} is not an integer")
        cached = p.get("pc", 0)
        if cached.__class__ is not int or cached < 0:
            raise TypeError(f"cached prefix {cached!r} is not a non-negative integer")
        return len(p["ids"]), len(p["lp"]), len(p["top"]), wm, None if fin is None else str(fin[0]), cached
    if kind == _FINISH:
        return str(p["reason"]), int(p["n_out"]), int(p["kv"])
    if kind == _BEGIN:
        return (len(p["prompt"]),)
    return _EMPTY


def apply_fact(req: ReqCheck, lsn: int, kind: int, fact: tuple[Any, ...], out: Violations) -> None:
    """Advance one request's checks by one non-BEGIN record."""
    if req.finish_lsn is not None:
        out.add(lsn, req.rid, "I7", f"{Kind(kind).name} after the request's FINISH at LSN {req.finish_lsn}")
        return
    req.lsns.append(lsn)
    if kind == _COMMIT:
        _apply_commit(req, lsn, fact, out)
    elif kind == _ABORT:
        if req.abort_lsn is not None:
            out.add(lsn, req.rid, "state", f"second ABORT_REQUESTED (first at LSN {req.abort_lsn})")
        req.abort_lsn = req.abort_lsn or lsn
    elif kind == _FINISH:
        _apply_finish(req, lsn, fact, out)


def _apply_commit(req: ReqCheck, lsn: int, fact: tuple[Any, ...], out: Violations) -> None:
    num_ids, num_lp, num_top, watermark, fin, cached = fact
    if cached and (req.watermark or req.num_out):
        out.add(lsn, req.rid, "watermark", f"cached prefix of {cached} on a COMMIT that is not the request's first")
    if cached and (watermark is None or watermark < cached):
        out.add(lsn, req.rid, "watermark", f"KV watermark {watermark} below the cached prefix of {cached}")
    if req.abort_lsn is not None:
        out.add(lsn, req.rid, "I2", f"COMMIT of {num_ids} token(s) after ABORT_REQUESTED at LSN {req.abort_lsn}")
    if req.fin_commit is not None:
        out.add(lsn, req.rid, "state", f"COMMIT after a COMMIT that finished the request ({req.fin_commit})")
    if num_lp not in (0, num_ids) or num_top not in (0, num_ids):
        out.add(lsn, req.rid, "lengths", f"{num_ids} token(s) but {num_lp} logprob(s), {num_top} top-logprob list(s)")
    if watermark is not None:
        if watermark < req.watermark:
            out.add(lsn, req.rid, "watermark", f"KV watermark went down from {req.watermark} to {watermark}")
        req.watermark = watermark
    req.num_out += num_ids
    req.num_logprobs += num_lp
    req.fin_commit = fin or req.fin_commit


def _apply_finish(req: ReqCheck, lsn: int, fact: tuple[Any, ...], out: Violations) -> None:
    reason, num_out, kv = fact
    if num_out != req.num_out:
        out.add(lsn, req.rid, "I6", f"FINISH says n_out={num_out} but its COMMITs hold {req.num_out} token(s)")
    if kv != req.watermark:
        out.add(lsn, req.rid, "I6", f"FINISH says kv={kv} but its COMMITs left the watermark at {req.watermark}")
    if req.fin_commit is not None and reason != req.fin_commit:
        out.add(lsn, req.rid, "I6", f"FINISH reason {reason!r} but the finishing COMMIT said {req.fin_commit!r}")
    if req.num_logprobs not in (0, req.num_out):
        out.add(lsn, req.rid, "lengths", f"{req.num_out} token(s) but {req.num_logprobs} logprob(s) in all")
    req.finish_lsn, req.finish_reason = lsn, reason


@dataclass(slots=True)
class RangeResult:
    """One range's findings; `merge` joins them in LSN order."""

    violations: Violations = field(default_factory=Violations)
    reqs: dict[str, ReqCheck] = field(default_factory=dict)  # began here; finished ones dropped at the end
    carried: dict[str, Carried] = field(default_factory=dict)
    server_events: list[tuple[int, int]] = field(default_factory=list)  # (lsn, kind) of START/STOP
    finish_counts: dict[str, int] = field(default_factory=dict)
    interrupted: list[str] = field(default_factory=list)
    num_begun: int = 0
    finished: list[Incarnation] = field(default_factory=list)  # incarnations that began and finished here


class RangeChecker:
    """Feed it a range's records in LSN order, then take `result`."""

    def __init__(self) -> None:
        self.res = RangeResult()
        self._open: set[str] = set()

    def feed(self, lsn: int, kind: int, rid: str | None, payload: dict[str, Any]) -> None:
        if kind == _COMMIT and self._plain_commit(lsn, rid, payload):  # most records by far
            return
        if (rid is None) != (kind in _SERVER_KINDS):
            self.res.violations.add(lsn, rid, "format", f"{Kind(kind).name} record with rid {rid!r}")
            return
        try:
            fact = payload_fact(kind, payload)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            self.res.violations.add(lsn, rid, "format", f"{Kind(kind).name} payload malformed ({exc!r})")
            return
        if rid is None:
            self._server(lsn, kind)
        elif kind == _BEGIN:
            self._begin(lsn, rid)
        else:
            self._record(lsn, kind, rid, fact)

    def _plain_commit(self, lsn: int, rid: str | None, p: dict[str, Any]) -> bool:
        """The common case, checked inline (verify's hot path): a COMMIT of a running request with
        consistent lengths and a rising watermark. Anything else takes the full checks."""
        req = self.res.reqs.get(rid)  # type: ignore[arg-type]
        if req is None or req.finish_lsn is not None or req.abort_lsn is not None or req.fin_commit is not None:
            return False
        ids, lp, wm = p.get("ids"), p.get("lp"), p.get("wm")
        if ids.__class__ is not tuple or lp.__class__ is not tuple or p.get("fin") is not None or "pc" in p:
            return False
        num_ids, num_lp = len(ids), len(lp)
        if (num_lp != num_ids and num_lp) or len(p.get("top", ())) not in (0, num_ids):
            return False
        if wm is not None:
            if wm.__class__ is not int or wm < req.watermark:
                return False
            req.watermark = wm
        req.num_out += num_ids
        req.num_logprobs += num_lp
        req.lsns.append(lsn)
        return True

    def _server(self, lsn: int, kind: int) -> None:
        if kind not in (Kind.SERVER_START.value, Kind.SERVER_STOP.value):
            return
        self.res.server_events.append((lsn, kind))
        for rid in sorted(self._open):
            self.res.violations.add(lsn, rid, "I7", f"still running at {Kind(kind).name} (no FINISH before it)")

    def _begin(self, lsn: int, rid: str) -> None:
        res = self.res
        res.num_begun += 1
        if rid in self._open:
            res.violations.add(lsn, rid, "I7", f"BEGIN while the request is running (BEGIN at LSN {res.reqs[rid].begin_lsn})")
        carried = res.carried.get(rid)
        if carried is not None and carried.next_begin is None and rid not in res.reqs:
            carried.next_begin = lsn
        res.reqs[rid] = ReqCheck(rid, lsn, lsns=[lsn])
        self._open.add(rid)

    def _record(self, lsn: int, kind: int, rid: str, fact: tuple[Any, ...]) -> None:
        res = self.res
        req = res.reqs.get(rid)
        if req is None:
            res.carried.setdefault(rid, Carried()).facts.append((lsn, kind, fact))
        else:
            finished = req.finish_lsn is not None
            apply_fact(req, lsn, kind, fact, res.violations)
            if not finished and req.finish_lsn is not None:
                res.finished.append(req.incarnation())
        if kind == _FINISH:
            reason = fact[0]
            res.finish_counts[reason] = res.finish_counts.get(reason, 0) + 1
            if reason == "interrupted":
                res.interrupted.append(rid)
            self._open.discard(rid)

    def result(self) -> RangeResult:
        self.res.reqs = {rid: self.res.reqs[rid] for rid in self._open}
        return self.res


@dataclass(slots=True)
class Merged:
    violations: Violations = field(default_factory=Violations)
    open: dict[str, ReqCheck] = field(default_factory=dict)  # requests with no FINISH at the end
    finish_counts: dict[str, int] = field(default_factory=dict)
    interrupted: list[str] = field(default_factory=list)
    num_begun: int = 0
    finished: list[Incarnation] = field(default_factory=list)  # every finished incarnation, for the index


def merge(results: list[RangeResult]) -> Merged:
    """Join consecutive ranges' results: replay carried records, check server events against them."""
    merged = Merged()
    for res in results:
        _join_carried(merged, res)
        merged.open.update(res.reqs)
        for item in res.violations.items:
            merged.violations.add(item.lsn, item.rid, item.check, item.message)
        merged.violations.count += res.violations.count - len(res.violations.items)
        for reason, n in res.finish_counts.items():
            merged.finish_counts[reason] = merged.finish_counts.get(reason, 0) + n
        merged.interrupted.extend(res.interrupted)
        merged.num_begun += res.num_begun
        merged.finished.extend(res.finished)
    merged.violations.items.sort(key=lambda v: v.lsn)
    return merged


def _join_carried(merged: Merged, res: RangeResult) -> None:
    before = merged.open
    out = merged.violations
    for rid, carried in sorted(res.carried.items(), key=lambda item: item[1].facts[0][0]):
        req = before.get(rid)
        if req is None:
            out.add(carried.facts[0][0], rid, "state", "record of no running request (no BEGIN before it, or after its FINISH)")
            continue
        finished = req.finish_lsn is not None
        for lsn, kind, fact in carried.facts:
            apply_fact(req, lsn, kind, fact, out)
        if not finished and req.finish_lsn is not None:
            merged.finished.append(req.incarnation())
        if carried.next_begin is not None and req.finish_lsn is None:
            out.add(carried.next_begin, rid, "I7", f"BEGIN while the request is running (BEGIN at LSN {req.begin_lsn})")
    for lsn, kind in res.server_events:
        for rid, req in sorted(before.items()):
            if req.finish_lsn is None or req.finish_lsn > lsn:
                out.add(lsn, rid, "I7", f"still running at {Kind(kind).name} (no FINISH before it)")
    merged.open = {rid: req for rid, req in before.items() if req.finish_lsn is None}
