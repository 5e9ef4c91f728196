"""Structured logging set-up, shared by the front and the scheduler process.

The scheduler is spawned, so it starts with structlog's defaults: both processes call this
and render alike (JSON with `--log-format json`) on the stderr they share, so every line —
request logs and chain heads alike — reaches the same log pipeline.
"""
from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(fmt: str) -> None:
    renderer: structlog.typing.Processor = (structlog.processors.JSONRenderer() if fmt == "json"
                                            else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                                    renderer], logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
