"""What the post-mortem commands share: error handling, progress, times, tokenizers, output."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lmdb
from rich.console import Console
from rich.text import Text

from commitlog import CommitLogError, CorruptRecordError
from commitlog.errors import SALVAGE_HINT
from commitlog.wal import META_TOKENIZER_DIR
from ops.logcli.source import IsolatedLog
from server.config import default_log_dir
from server.errors import TokenLedgerError

EXIT_OK, EXIT_VIOLATION, EXIT_CORRUPT = 0, 1, 2
Command = Callable[[argparse.Namespace], int]
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def stdout() -> Console:
    """Markup off: rids, paths and messages come from the log and must print as they are."""
    return Console(soft_wrap=True, markup=False, highlight=False, emoji=False)


def styled(label: str, style: str, rest: str) -> Text:
    return Text.assemble((label, style), rest)


def fail(message: str, code: int = EXIT_CORRUPT) -> int:
    print(f"tokenledger: error: {message}", file=sys.stderr)
    return code


def salvage_command(log_dir: str) -> str:
    return SALVAGE_HINT.format(log_dir=log_dir)


def guarded(command: Command) -> Command:
    """Turn every log error into a message and exit status 2: never a traceback."""
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except CorruptRecordError as exc:
            return fail(f"{exc}\nthe log is damaged; copy out every intact record with:\n  "
                        f"{salvage_command(args.log_dir)}")
        except (CommitLogError, lmdb.Error) as exc:
            return fail(f"cannot read the log at {args.log_dir}: {exc}")
        except TokenLedgerError as exc:  # e.g. --tokenizer names no tokenizer
            return fail(str(exc))
        except BrokenPipeError:  # `| head` closed the pipe: not an error worth a message
            return EXIT_OK
    return run


@contextmanager
def open_log(log_dir: str) -> Iterator[IsolatedLog]:
    """The log for replay, audit and export: every read crash-isolated in a child (`ops.logcli.source`)."""
    yield IsolatedLog(log_dir)


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[..., None]]:
    """A rich progress bar on stderr when it is a terminal; a no-op when piped.

    Yields `tick(done, total=None)`."""
    if not sys.stderr.isatty():
        yield lambda done, total=None: None
        return
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done, total=None: bar.update(task, completed=done, total=total or bar.tasks[0].total)


def parse_since(text: str, now_s: float | None = None) -> int:
    """`--since`: a duration ago (`90s`, `15m`, `2h`, `1d`), epoch seconds, or ISO 8601; returns ns."""
    match = _DURATION.match(text.strip())
    if match:
        now = time.time() if now_s is None else now_s
        return int((now - float(match.group(1)) * _UNIT_S[match.group(2)]) * 1e9)
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {text!r}: expected a duration (15m, 2h, 1d), epoch seconds or ISO 8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1e9)


class TextDecoder:
    """Output ids to text the way the server returned it (special tokens skipped, cut at a stop string)."""

    def __init__(self, path: str) -> None:
        from server.tokenizer import Tokenizer  # tokenizers/transformers only; no torch

        self._tok = Tokenizer(Path(path))

    def decode(self, ids: list[int], finish_reason: dict[str, Any] | None = None,
               params: dict[str, Any] | None = None) -> str:
        """`params`: the request's logged sampling params (their text options, when not neutral)."""
        from server.finish import shown_text

        p = params or {}
        skip = bool(p.get("skip_special_tokens", True))
        spaces = bool(p.get("spaces_between_special_tokens", True))
        return shown_text(ids, lambda part: self._tok.decode(part, skip, spaces), finish_reason,
                          bool(p.get("no_stop_trim", False)))


def load_decoder(path: str | None, reader: IsolatedLog) -> TextDecoder | None:
    """`--tokenizer`, else the tokenizer directory the server recorded, if it is still there."""
    if path is None:
        recorded = reader.get_meta(META_TOKENIZER_DIR)
        # os.fsdecode: a path is bytes to the OS; damaged (non-UTF-8) bytes name no directory, never an error.
        path = os.fsdecode(recorded) if recorded and Path(os.fsdecode(recorded)).is_dir() else None
    return None if path is None else TextDecoder(path)


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def add_log_dir(p: argparse.ArgumentParser) -> None:
    # The default is where `tokenledger serve` writes without --log-dir, so `make serve` then
    # `tokenledger verify` reads the server's log with no flag at all.
    p.add_argument("--log-dir", default=str(default_log_dir()),
                   help="the log directory (a live server's is fine: read-only; default: where serve writes, %(default)s)")


def add_tokenizer(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="a model or tokenizer directory, to decode output ids to text")
