"""`python -m ops.logcli COMMAND`: the post-mortem commands without the rest of the CLI (no torch)."""
from __future__ import annotations

import argparse
import sys

from ops.logcli import add_parsers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.logcli", description=__doc__)
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
