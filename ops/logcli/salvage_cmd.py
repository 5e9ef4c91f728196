"""`tokenledger salvage`: copy every intact record of a damaged log into a new log that verifies."""
from __future__ import annotations

import argparse
from pathlib import Path

from commitlog import LogReader, salvage
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
    reader = LogReader.open(out)
    try:
        last = reader.last_lsn()
    finally:
        reader.close()
    lost = report.lost_lsns
    if args.json:
        print(dumps({"out": str(out), "num_copied": report.num_copied, "lost_lsns": lost, "checkpoint_lsn": last}))
        return 0
    console = stdout()
    console.print(f"copied {report.num_copied} record(s) from {args.log_dir} to {out}; "
                  f"closing CHECKPOINT at LSN {last}")
    if lost:
        shown = ", ".join(map(str, lost[:20])) + (" ..." if len(lost) > 20 else "")
        console.print(styled("lost", "bold red", f" {len(lost)} record(s): LSN {shown}"))
        console.print("requests that had records there show up in `tokenledger verify` on the copy")
    else:
        console.print("nothing was lost")
    console.print(f"check the copy with: tokenledger verify --log-dir {out}")
    return 0
