"""Re-executes a log: per instance, rebuild its engine, walk its events in LSN order (arrivals,
launches from the FORWARD records, result processing where the log shows it, aborts), check
every forward's results as they are computed, then compare the outcomes the real result path
committed (finish, watermark, grammar, discards) with the logged ones.
"""
from __future__ import annotations

import shutil
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from commitlog import DoomSource
from ops.reexec.checker import ResultChecker
from ops.reexec.compare import Divergence, Finding, Status, Tolerance
from ops.reexec.outcomes import compare_outcomes
from ops.reexec.plan import Event, EventKind, Instance, PlannedForward, spread_exclusions
from ops.reexec.requests import NotReexecutableError, request_from_log
from ops.reexec.runtime import build_scripted, check_model, server_args
from ops.reexec.scripted import ScheduleMismatchError, Script, ScriptedScheduler
from server.request import Req
from server.sampling.sampler import LEGACY_SAMPLER

Tick = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Options:
    model_path: str | None = None
    isolated: bool = False
    rids: frozenset[str] | None = None  # None: every request


def reexecute(instances: list[Instance], options: Options, tick: Tick) -> list[Finding]:
    """Findings for the selected requests, in log order. Raises ModelUnavailableError (nothing run)."""
    findings: list[Finding] = []
    for instance in instances:
        findings.extend(_instance(instance, options, tick))
    return [f for f in findings if options.rids is None or f.rid in options.rids]


def _instance(instance: Instance, options: Options, tick: Tick) -> list[Finding]:
    reqs = _prepare(instance, options)
    findings = {r.begin_lsn: Finding(r.rid, r.incarnation) for r in instance.requests}
    for r in instance.requests:
        if r.excluded:
            findings[r.begin_lsn].exclude(r.excluded)
    if instance.engine is not None and reqs:
        model_dir = check_model(instance.engine, instance.fingerprint, options.model_path)
        scratch = Path(tempfile.mkdtemp(prefix="tokenledger-reexec-"))
        try:
            _run(instance, options, reqs, findings, model_dir, scratch, tick)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return [findings[r.begin_lsn] for r in instance.requests]


def _prepare(instance: Instance, options: Options) -> dict[int, Req]:
    """The Reqs to run, by BEGIN LSN; a request that cannot be rebuilt is excluded (and, in the logged
    batches, whoever shares a forward with it)."""
    reqs: dict[int, Req] = {}
    logged_sampler = (instance.engine or {}).get("sampler", LEGACY_SAMPLER)
    for logged in instance.requests:
        if options.isolated and options.rids is not None and logged.rid not in options.rids:
            logged.excluded = logged.excluded or "not selected"
        if logged.excluded:
            continue
        try:
            reqs[logged.begin_lsn] = request_from_log(logged, logged_sampler)
        except NotReexecutableError as exc:
            logged.excluded = str(exc)
    if not options.isolated:
        spread_exclusions(instance)
    return {r.begin_lsn: reqs[r.begin_lsn] for r in instance.requests if not r.excluded and r.begin_lsn in reqs}


def _run(instance: Instance, options: Options, reqs: dict[int, Req], findings: dict[int, Finding],
         model_dir: Path, scratch: Path, tick: Tick) -> None:
    assert instance.engine is not None
    _, sched = build_scripted(server_args(instance.engine, model_dir, instance.tokenizer_dir), scratch)
    checker = ResultChecker(Tolerance(options.isolated))
    checker.findings = findings
    sched.runner.hook = checker  # type: ignore[attr-defined]
    walk = _Walk(sched, reqs, checker, options.isolated)
    try:
        for event in instance.events:
            walk.apply(event)
            sched.flush()
            tick()
    except ScheduleMismatchError as exc:
        _stopped(findings, {lsn: reqs[lsn] for lsn in walk.begun}, exc)
    finally:
        sched.ledger.close()
        if sched.grammars is not None:
            sched.grammars.close()
    compare_outcomes(instance, findings, scratch)


def _stopped(findings: dict[int, Finding], begun: dict[int, Req], exc: ScheduleMismatchError) -> None:
    """The log's schedule cannot be followed past here: the request it names diverged; what was still
    running, or had not begun, cannot be proven."""
    for lsn, finding in findings.items():
        req = begun.get(lsn)
        if req is not None and req.rid == exc.rid and not req.is_finished:
            finding.diverge(Divergence(len(req.output_ids), "schedule", str(exc), "not followable here"))
        elif (req is None or not req.is_finished) and finding.status is Status.PROVEN:
            finding.exclude(f"re-execution stopped early: {exc.rid!r}'s schedule could not be followed ({exc})")


class _Walk:
    """Applies events to the scripted scheduler; `seqs` mirrors its in-flight queue with log seqs."""

    def __init__(self, sched: ScriptedScheduler, reqs: dict[int, Req], checker: ResultChecker, isolated: bool) -> None:
        self.sched, self.reqs, self.checker, self.isolated = sched, reqs, checker, isolated
        self.seqs: deque[int] = deque()
        self.begun: list[int] = []  # BEGIN LSNs of the requests added so far

    def apply(self, event: Event) -> None:
        if event.kind is EventKind.BEGIN:
            assert event.request is not None
            req = self.reqs.get(event.request.begin_lsn)
            if req is not None:
                self.sched.add_request(req)
                self.begun.append(event.request.begin_lsn)
        elif event.kind is EventKind.LAUNCH:
            assert event.forward is not None
            self._launch(event.forward)
        elif event.kind is EventKind.PROCESS:
            assert event.forward is not None
            self._process_through(event.forward.forward.seq)
        else:
            self._abort(event)

    def _launch(self, planned: PlannedForward) -> None:
        fwd = planned.forward
        # The forwards still pending at this launch were the `pending` latest: older ones were processed.
        self._process_through(fwd.seq - fwd.pending - 1)
        members = [(m, seg, out) for m, seg, out in zip(planned.members, fwd.segments, planned.outcomes)
                   if m.begin_lsn in self.reqs]
        groups = [[m] for m in members] if self.isolated else ([members] if members else [])
        for group in groups:
            self.checker.expect([m.begin_lsn for m, _, _ in group], [out for _, _, out in group])
            self.sched.script = Script(None if self.isolated else fwd.mode,
                                       [(self.reqs[m.begin_lsn], seg) for m, seg, _ in group])
            self.sched.launch_next()
            self.seqs.append(fwd.seq)

    def _process_through(self, seq: int) -> None:
        while self.seqs and self.seqs[0] <= seq:
            self.sched.process_oldest()
            self.seqs.popleft()

    def _abort(self, event: Event) -> None:
        assert event.request is not None and event.record is not None
        if event.request.begin_lsn in self.reqs:
            p = event.record.payload
            self.sched.abort(event.request.rid, DoomSource(p["source"]), lambda _a, _e: None, p["reason"])
