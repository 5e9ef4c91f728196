"""`tokenledger audit`: one JSON object per request (what `GET /requests/{rid}` returns), or a table."""
from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator

from commitlog.audit import (
    STATUSES,
    RequestAudit,
    audit_incarnations,
    iter_audits,
    writer_alive,
)
from ops.logcli.common import (
    add_log_dir,
    dumps,
    fail,
    guarded,
    open_log,
    parse_since,
    progress_bar,
    stdout,
)
from ops.logcli.replay import request_table


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="per-request account from the log (JSON lines or a table)",
                       description=__doc__)
    add_log_dir(p)
    p.add_argument("--rid", default=None, help="only this request (each incarnation, when the rid was used again)")
    p.add_argument("--status", choices=STATUSES, default=None, help="only requests with this status")
    p.add_argument("--since", type=parse_since, default=None, metavar="T",
                   help="only requests begun at or after T: a duration ago (15m, 2h, 1d), epoch seconds or ISO 8601")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(run=guarded(run))


def run(args: argparse.Namespace) -> int:
    alive = writer_alive(args.log_dir)
    with open_log(args.log_dir) as reader:
        if args.rid is not None:
            audits: Iterable[RequestAudit] = audit_incarnations(reader.request_records(args.rid), alive)
            if not audits:
                return fail(f"no request {args.rid!r} in {args.log_dir}")
        else:
            tick_total = reader.last_lsn()
            with progress_bar("audit", tick_total) as tick:
                audits = list(iter_audits(reader, None, alive, tick))
    selected = list(_select(audits, args.status, args.since))
    if args.json:
        for audit in sorted(selected, key=lambda a: a.begin_lsn):
            print(dumps(audit.to_dict()))
    else:
        stdout().print(request_table(selected))
    return 0


def _select(audits: Iterable[RequestAudit], status: str | None, since_ns: int | None) -> Iterator[RequestAudit]:
    for audit in audits:
        if (status is None or audit.status == status) and (since_ns is None or audit.begin_ns >= since_ns):
            yield audit
