"""`tokenledger replay`: rebuild state from the log, as it is now or as it stood at an LSN.

Without --rid: one row per request. With --rid: that request's timeline, record by record.
"""
from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from commitlog import Kind, Record
from commitlog.audit import audit_incarnations, iter_audits, writer_alive
from ops.logcli import reexec_cmd
from ops.logcli.common import (
    TextDecoder,
    add_log_dir,
    add_tokenizer,
    fail,
    guarded,
    load_decoder,
    open_log,
    progress_bar,
    stdout,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="rebuild requests from the log: a table, or one request's timeline",
                       description=__doc__)
    add_log_dir(p)
    p.add_argument("--rid", action="extend", nargs="+", default=None, metavar="R",
                   help="show this request's timeline (with --reexecute: re-execute these requests only)")
    p.add_argument("--until-lsn", type=int, default=None, metavar="N", help="the state as of LSN N")
    add_tokenizer(p)
    reexec_cmd.add_arguments(p)
    p.set_defaults(run=guarded(run))


def run(args: argparse.Namespace) -> int:
    if args.reexecute:
        if args.until_lsn is not None:
            return fail("--until-lsn and --reexecute do not go together: re-execution proves the whole log")
        return reexec_cmd.run(args)
    if args.model_path or args.isolated or args.json:
        return fail("--model-path, --isolated and --json go with --reexecute")
    if args.rid is not None and len(args.rid) > 1:
        return fail("give one --rid for a timeline (several go with --reexecute)")
    args.rid = args.rid[0] if args.rid else None
    with open_log(args.log_dir) as reader:
        if args.rid is None:
            with progress_bar("replay", reader.last_lsn()) as tick:
                audits = list(iter_audits(reader, args.until_lsn, writer_alive(args.log_dir), tick))
            stdout().print(request_table(audits))
            return 0
        records = [r for r in reader.request_records(args.rid) if args.until_lsn is None or r.lsn <= args.until_lsn]
        decoder = load_decoder(args.tokenizer, reader) if records else None
    if not records:
        return fail(f"no request {args.rid!r} in {args.log_dir}" + (f" up to LSN {args.until_lsn}" if args.until_lsn else ""))
    print_timeline(records, decoder, args.until_lsn is not None or writer_alive(args.log_dir))
    return 0


def request_table(audits: list[Any]) -> Table:
    table = Table("rid", "status", "prompt", "completion", "finish reason", "aborted at", "discarded",
                  title=f"{len(audits)} request(s)")
    for a in sorted(audits, key=lambda a: a.begin_lsn):
        aborted = f"LSN {a.abort_lsn} ({a.abort_source})" if a.abort_lsn else "-"
        table.add_row(a.rid, a.status, str(a.prompt_tokens), str(a.completion_tokens),
                      _reason(a.finish_reason), aborted, str(a.discarded_results))
    return table


def _reason(finish: dict[str, Any] | None) -> str:
    if not finish:
        return "-"
    extra = [f"{k}={v!r}" for k, v in finish.items() if k != "type" and v is not None]
    return finish["type"] + (f" ({', '.join(extra)})" if extra else "")


def print_timeline(records: list[Record], decoder: TextDecoder | None, alive: bool) -> None:
    begin_ns = records[0].ts_ns
    table = Table("LSN", "+ms", "event", "detail", title=f"request {records[0].rid}")
    for record in records:
        table.add_row(str(record.lsn), f"{(record.ts_ns - begin_ns) / 1e6:.1f}", record.kind.name,
                      _detail(record, decoder))
    out = stdout()
    out.print(table)
    audits = audit_incarnations(records, alive)
    if not audits:
        out.print("no BEGIN for this request in the log (lost in a salvage?)")
        return
    for audit in audits:  # a rid used again after it finished: one account per incarnation
        label = f"incarnation {audit.incarnation} (BEGIN at LSN {audit.begin_lsn}): " if len(audits) > 1 else ""
        out.print(f"{label}status {audit.status}, finish reason {_reason(audit.finish_reason)}, "
                  f"{audit.completion_tokens} output token(s), {audit.discarded_results} discarded result(s)")
        out.print(f"output_ids {audit.output_ids}")
        if decoder is not None:
            out.print(f"text {decoder.decode(audit.output_ids, audit.finish_reason, audit.sampling_params)!r}")


def _detail(record: Record, decoder: TextDecoder | None) -> str:
    p = record.payload
    kind = record.kind
    if kind is Kind.BEGIN:
        params = p["params"]
        return (f"prompt {len(p['prompt'])} token(s); max_new_tokens {params.get('max_new_tokens')}, "
                f"temperature {params.get('temperature')}, seed {params.get('seed')}")
    if kind is Kind.COMMIT:
        return _commit_detail(p, decoder)
    if kind is Kind.DISCARD:
        return f"result discarded: {p['reason']}"
    if kind is Kind.ABORT_REQUESTED:
        return f"abort received from {p['source']}: {p['reason']}"
    if kind is Kind.FINISH:
        return f"{p['reason']} (matched {p['matched']!r}); {p['n_out']} output token(s); KV released, watermark {p['kv']}"
    return ""


def _commit_detail(p: dict[str, Any], decoder: TextDecoder | None) -> str:
    parts = [f"tokens {list(p['ids'])}"]
    if p["lp"]:
        parts.append("logprobs [" + ", ".join(f"{lp:.4f}" for lp in p["lp"]) + "]")
    if p["ilp"]:
        parts.append(f"{len(p['ilp'])} prompt logprob(s) [" + ", ".join(f"{lp:.4f}" for lp in p["ilp"]) + "]")
    if decoder is not None and p["ids"]:
        parts.append(f"text {decoder.decode(list(p['ids']))!r}")
    if p["wm"] is not None:
        parts.append(f"watermark {p['wm']}")
    if p["fin"] is not None:
        parts.append(f"finishes: {p['fin'][0]}")
    return "; ".join(parts)
