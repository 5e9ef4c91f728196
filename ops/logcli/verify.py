"""`tokenledger verify`: is the log intact, and does every request obey the commit protocol?

Exit 0: every check holds (requests a crash interrupted are reported, not failures).
Exit 1: invariant violations, each with its LSN and rid (a rewritten record is one).
Exit 2: the log is damaged or unreadable: the first bad LSN and the salvage command.
"""
from __future__ import annotations

import argparse
import re
from typing import Any

from rich.table import Table

from commitlog.audit import writer_alive
from ops.logcli.checklog import ExpectedHead, LogCheck, check_log
from ops.logcli.common import (
    add_log_dir,
    dumps,
    guarded,
    progress_bar,
    salvage_command,
    stdout,
    styled,
)

_HEAD = re.compile(r"^(?:(\d+):)?([0-9a-fA-F]{64})$")
SHOWN_RIDS = 20


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check the log's records, hash chain and commit-protocol invariants",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_log_dir(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--expect-head", type=_expected_head, default=None, metavar="[LSN:]HASH",
                   help="a chain head published earlier (as printed here): fail unless this log extends it")
    p.add_argument("--jobs", type=int, default=None, help="processes to check LSN ranges with (default: CPUs)")
    p.set_defaults(run=guarded(run))


def _expected_head(text: str) -> ExpectedHead:
    match = _HEAD.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError("expected 64 hex digits, optionally prefixed by `LSN:`")
    return ExpectedHead(bytes.fromhex(match.group(2)), int(match.group(1)) if match.group(1) else None)


def run(args: argparse.Namespace) -> int:
    with progress_bar("verify", None) as tick:
        report = check_log(args.log_dir, args.expect_head, args.jobs, tick)
    alive = writer_alive(args.log_dir)
    if args.json:
        print(dumps(as_json(report, alive)))
    else:
        _print(report, alive)
    return report.exit_code


def as_json(report: LogCheck, alive: bool) -> dict[str, Any]:
    failure = report.failure
    m = report.merged
    return {
        "log_dir": report.log_dir, "ok": report.exit_code == 0, "exit_code": report.exit_code,
        "num_records": report.num_records, "first_lsn": report.first_lsn, "last_lsn": report.last_lsn,
        "head": report.head.hex() if failure is None else None, "head_lsn": report.head_lsn,
        "checkpoint_start": report.checkpoint_start, "salvage_lost_lsns": report.lost,
        "salvage_lost_ranges": [list(r) for r in report.lost_ranges],
        "requests": {"begun": m.num_begun, **m.finish_counts, ("running" if alive else "unrecovered"): len(m.open)},
        "interrupted": m.interrupted, "running" if alive else "unrecovered": sorted(m.open),
        "num_violations": m.violations.count,
        "violations": [{"lsn": v.lsn, "rid": v.rid, "check": v.check, "message": v.message} for v in m.violations.items],
        "error": None if failure is None else {
            "kind": failure.status, "lsn": failure.lsn, "message": failure.message,
            "salvage_command": salvage_command(report.log_dir) if _salvageable(report) else None},
    }


def _print(report: LogCheck, alive: bool) -> None:
    out = stdout()
    if report.failure is not None:
        f = report.failure
        label = "UNREADABLE" if f.status in ("unreadable", "internal") else "CORRUPT"
        out.print(styled(label, "bold red", f" {report.log_dir}: {f.message}"))
        if f.lsn is not None:
            out.print(f"first bad record: LSN {f.lsn}")
        if _salvageable(report):
            out.print(f"copy out every intact record with:\n  {salvage_command(report.log_dir)}")
        return
    m = report.merged
    counts = ", ".join(f"{n} {reason}" for reason, n in sorted(m.finish_counts.items()))
    out.print(f"log       {report.log_dir}: {report.num_records} records, LSN {report.first_lsn}..{report.last_lsn}"
              + (f", checkpoint start {report.checkpoint_start}" if report.checkpoint_start > 1 else ""))
    still = f"; {len(m.open)} {'running' if alive else 'unfinished, no writer: a crash not yet recovered'}"
    out.print(f"requests  {m.num_begun} begun; finished: {counts or 'none'}{still if m.open else ''}")
    _print_rids(out, "interrupted", m.interrupted)
    _print_rids(out, "running" if alive else "unrecovered", sorted(m.open))
    if report.lost or report.lost_ranges:
        ranges = "".join(f", {a}..{b}" for a, b in report.lost_ranges[:10]).lstrip(", ")
        lsns = _short(report.lost) + (", " if report.lost and ranges else "") + ranges
        total = len(report.lost) + sum(b - a + 1 for a, b in report.lost_ranges)
        out.print(f"salvaged  {total} record(s) were lost: LSN {lsns}")
    out.print(f"head      LSN {report.head_lsn} {report.head.hex()}")
    if not m.violations.count:
        out.print(styled("OK", "bold green", ": every record, the hash chain and every invariant hold"))
        return
    table = Table("LSN", "rid", "check", "violation", title=f"{m.violations.count} violation(s)")
    for v in m.violations.items:
        table.add_row(str(v.lsn), v.rid or "-", v.check, v.message)
    out.print(table)
    if m.violations.count > len(m.violations.items):
        out.print(f"... {m.violations.count - len(m.violations.items)} more not shown")


def _salvageable(report: LogCheck) -> bool:
    """Salvage copies intact records out of a readable file; a truncated or missing one it cannot help."""
    f = report.failure
    return f is not None and (f.lsn is not None or f.status == "crashed")


def _print_rids(out: Any, label: str, rids: list[str]) -> None:
    if rids:
        more = f" (+{len(rids) - SHOWN_RIDS} more)" if len(rids) > SHOWN_RIDS else ""
        out.print(f"{label:<9} {', '.join(rids[:SHOWN_RIDS])}{more}")


def _short(lsns: list[int]) -> str:
    return ", ".join(map(str, lsns[:10])) + (" ..." if len(lsns) > 10 else "")

