"""`tokenledger salvage`: copy every intact record of a damaged log into a new log that verifies."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from commitlog import SalvageReport, salvage
from ops.logcli.common import add_log_dir, dumps, fail, guarded, stdout, styled


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("salvage", help="copy every readable record of a damaged log into a new log",
                       description=__doc__)
    add_log_dir(p)
    p.add_argument("--out", required=True, metavar="D2", help="a new, empty directory for the salvaged log")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(run=guarded(run))


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        return fail(f"{out} is not empty; salvage writes a fresh log")
    report = salvage(args.log_dir, out)
    if args.json:
        print(dumps({"out": str(out), "num_copied": report.num_copied, "lost_lsns": report.lost_lsns,
                     "lost_ranges": [list(r) for r in report.lost_ranges], "lost_tail_unknown": report.tail_unknown,
                     "skipped_keys": [k.hex() for k in report.skipped_keys], "checkpoint_lsn": report.checkpoint_lsn}))
        return 0
    console = stdout()
    console.print(f"copied {report.num_copied} record(s) from {args.log_dir} to {out}; "
                  f"closing CHECKPOINT at LSN {report.checkpoint_lsn}")
    _print_losses(console, report)
    console.print(f"check the copy with: tokenledger verify --log-dir {out}")
    return 0


def _print_losses(console: Any, report: SalvageReport) -> None:
    if report.num_lost:
        lost = report.lost_lsns
        shown = ", ".join(map(str, lost[:20])) + (" ..." if len(lost) > 20 else "")
        ranges = ", ".join(f"{a}..{b}" for a, b in report.lost_ranges[:20])
        parts = [f"LSN {shown}" if lost else "", f"unreadable LSN {ranges}" if ranges else ""]
        console.print(styled("lost", "bold red", f" {report.num_lost} record(s): " + "; ".join(p for p in parts if p)))
        if report.tail_unknown:
            console.print("the end of the log could not be read: records after the last range may be lost too")
        console.print("requests that had records there show up in `tokenledger verify` on the copy")
    else:
        console.print("nothing was lost")
    if report.skipped_keys:
        keys = ", ".join(k.hex() for k in report.skipped_keys[:10])
        console.print(f"skipped {len(report.skipped_keys)} key(s) that name no LSN of this log: {keys}")
