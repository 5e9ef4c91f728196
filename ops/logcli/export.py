"""`tokenledger export`: every request as JSON lines, streamed, for a log pipeline.

Each line is the audit object plus top logprobs and input logprobs, and `text` when a
tokenizer is given. Requests come out as they finish in the log, then the unfinished ones.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from typing import Any

from commitlog.audit import RequestAudit, iter_audit_states, writer_alive
from commitlog.state import RequestState
from ops.logcli.common import (
    TextDecoder,
    add_log_dir,
    add_tokenizer,
    dumps,
    guarded,
    load_decoder,
    open_log,
    progress_bar,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="stream every request as JSON lines", description=__doc__)
    add_log_dir(p)
    p.add_argument("--format", choices=["jsonl"], default="jsonl")
    p.add_argument("--out", default=None, metavar="F", help="write here instead of stdout")
    add_tokenizer(p)
    p.set_defaults(run=guarded(run))


def run(args: argparse.Namespace) -> int:
    alive = writer_alive(args.log_dir)
    target = open(args.out, "w", encoding="utf-8") if args.out else nullcontext(sys.stdout)
    with target as sink, open_log(args.log_dir) as reader, progress_bar("export", reader.last_lsn()) as tick:
        decoder = load_decoder(args.tokenizer, reader)
        for audit, state in iter_audit_states(reader, None, alive, tick):
            sink.write(dumps(export_line(audit, state, decoder)) + "\n")
    return 0


def export_line(audit: RequestAudit, state: RequestState, decoder: TextDecoder | None) -> dict[str, Any]:
    line = audit.to_dict()
    line["prompt_ids"] = list(state.prompt_ids)
    line["output_top_logprobs"] = [[list(pair) for pair in top] for top in state.output_top_logprobs]
    line["input_logprobs"] = list(state.input_logprobs)
    line["num_hidden_states"] = len(state.hidden_states)
    if decoder is not None:
        line["text"] = decoder.decode(audit.output_ids, audit.finish_reason, audit.sampling_params)
    return line
