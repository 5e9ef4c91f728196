"""Operator defaults (issue 15, item 7): every log command reads the log where `serve` writes it
without a flag, and `tokenledger --help` says what each command is for."""
from __future__ import annotations

import pytest

from ops.cli import build_parser
from server.config import default_log_dir

LOG_COMMANDS = (["verify"], ["replay"], ["audit"], ["export"], ["salvage", "--out", "/tmp/x"])


@pytest.mark.parametrize("argv", LOG_COMMANDS, ids=lambda argv: argv[0])
def test_every_log_command_defaults_log_dir_to_where_serve_writes(argv):
    assert build_parser().parse_args(argv).log_dir == str(default_log_dir())


def test_serve_writes_to_the_same_default_log_dir(monkeypatch):
    from server.http import serve

    # serve falls back to this very function when --log-dir is not given.
    assert serve.default_log_dir is default_log_dir
    assert build_parser().parse_args(["serve"]).log_dir is None


def test_help_describes_each_command_and_the_default_log_dir(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for command in ("serve", "verify", "replay", "audit", "export", "salvage", "bench"):
        assert f"`{command}`" in text, command
    assert "follow)" not in text  # the stale "replay/verify/audit/export follow" line
    assert str(default_log_dir()) in text
