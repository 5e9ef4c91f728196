"""The `tokenledger` command line."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("tokenledger: no commands yet", file=sys.stderr)
    return 2
