"""After the run: what the real result path committed from the checked values (finish reasons, stop
strings, watermarks, grammar and reasoning counts, discards) against what the log holds."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from commitlog import Kind, LogReader, Record
from ops.reexec.compare import Divergence, Finding, Status
from ops.reexec.plan import Instance

_OUTCOMES = (Kind.COMMIT, Kind.DISCARD, Kind.FINISH)
Outcome = tuple[str, dict[str, Any]]


def _view(records: list[Record]) -> list[Outcome]:
    """The records a result produces. Hidden states were checked as they were computed (the checker)
    and are not put back in place; an interrupted FINISH is written by recovery, not by a result."""
    view = []
    for r in records:
        if r.kind not in _OUTCOMES or (r.kind is Kind.FINISH and r.payload.get("reason") == "interrupted"):
            continue
        payload = {k: _plain(v) for k, v in r.payload.items() if k != "hs"}
        view.append((r.kind.name, payload))
    return view


def _plain(value: Any) -> Any:
    """Tuples (from a fast scan) and lists compare equal."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _scratch_incarnations(scratch: Path) -> list[list[Record]]:
    reader = LogReader.open(scratch)
    try:
        records = list(reader.records())
    finally:
        reader.close()
    incarnations: list[list[Record]] = []
    current: dict[str, list[Record]] = {}
    for r in records:
        if r.rid is None:
            continue
        if r.kind is Kind.BEGIN:
            current[r.rid] = [r]
            incarnations.append(current[r.rid])
        elif r.rid in current:
            current[r.rid].append(r)
    return incarnations


def compare_outcomes(instance: Instance, findings: dict[int, Finding], scratch: Path) -> None:
    ran = [r for r in instance.requests if not r.excluded]
    for logged, recomputed in zip(ran, _scratch_incarnations(scratch)):
        assert recomputed[0].rid == logged.rid, "the scratch log's BEGINs follow the logged ones"
        finding = findings[logged.begin_lsn]
        if finding.status is not Status.PROVEN:
            continue
        old, new = _view(logged.records), _view(recomputed[1:])
        finished = any(r.kind is Kind.FINISH and r.payload.get("reason") != "interrupted" for r in logged.records)
        if not finished:
            new = new[: len(old)]  # the log stops here (a crash): so does the comparison
        _first_difference(finding, old, new)


def _first_difference(finding: Finding, old: list[Outcome], new: list[Outcome]) -> None:
    position = 0
    for i in range(max(len(old), len(new))):
        a = old[i] if i < len(old) else None
        b = new[i] if i < len(new) else None
        if a != b:
            finding.diverge(Divergence(position, "outcome", _describe(a), _describe(b)))
            return
        if a is not None and a[0] == "COMMIT":
            position += len(a[1]["ids"])


def _describe(outcome: Outcome | None) -> str:
    if outcome is None:
        return "nothing"
    kind, p = outcome
    if kind == "COMMIT":
        return f"COMMIT {p['ids']} fin={p['fin']} wm={p['wm']} g={p['g']} rc={p['rc']}"
    if kind == "DISCARD":
        return f"DISCARD ({p['reason']})"
    return f"FINISH {p['reason']} matched={p['matched']!r} n_out={p['n_out']} kv={p['kv']}"
