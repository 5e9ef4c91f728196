"""tokenledger: an LLM inference server whose every token is committed to a write-ahead log first.

`serve` runs the HTTP server (SGLang's /generate and the OpenAI routes). The post-mortem
commands read its log, read-only (safe beside a live server): `verify` checks records, hash
chain and the commit invariants; `replay` rebuilds requests as a table or one request's
timeline; `audit` gives a per-request account; `export` streams requests as JSON lines;
`salvage` copies what is readable out of a damaged log. `bench` measures the engine, the
log and a live server. Every log command reads the log where `serve` writes it unless
--log-dir says otherwise."""
from __future__ import annotations

import argparse
import sys

from ops import bench_checkpoint, bench_engine, bench_grammar, bench_offline, bench_serve, bench_throughput, bench_wal
from ops.server_args import add_server_args, server_args_from
from server.config import default_log_dir
from server.errors import TokenLedgerError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenledger", description=__doc__,
                                     epilog=f"default log directory: {default_log_dir()}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server")
    add_server_args(serve)
    serve.set_defaults(run=_serve)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    bench_engine.add_parser(bench_sub)
    bench_grammar.add_parser(bench_sub)
    bench_serve.add_parser(bench_sub)
    bench_offline.add_parser(bench_sub)
    bench_checkpoint.add_parser(bench_sub)
    bench_throughput.add_parser(bench_sub)
    bench_wal.add_parser(bench_sub)
    # verify, replay, audit, export, salvage
    from ops.logcli import add_parsers as add_logcli_parsers

    add_logcli_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except TokenLedgerError as exc:
        print(f"tokenledger: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _serve(ns: argparse.Namespace) -> int:
    from server.http.serve import run_server

    return run_server(server_args_from(ns))


if __name__ == "__main__":
    sys.exit(main())
