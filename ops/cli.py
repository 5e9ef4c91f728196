"""The `tokenledger` command line: serve and bench (replay/verify/audit/export follow)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from ops import bench_engine, bench_throughput, bench_wal
from ops.server_args import add_server_args, server_args_from
from server.errors import TokenLedgerError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenledger", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP server")
    add_server_args(serve)
    serve.set_defaults(run=_serve)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    bench_engine.add_parser(bench_sub)
    bench_throughput.add_parser(bench_sub)
    bench_wal.add_parser(bench_sub)
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
    import uvicorn

    from server.engine import Engine
    from server.http.app import create_app

    args = server_args_from(ns)
    engine = Engine(**asdict(args))
    try:
        print(f"tokenledger: serving {engine.runtime.model_dir} on http://{args.host}:{args.port}", file=sys.stderr)
        uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning")
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
