"""Typed errors raised at the server's boundaries (API, CLI, model loading).

The HTTP layer turns each into a 4xx/5xx JSON body and the CLI into a message and an
exit code; none of them should ever reach a user as a traceback.
"""
from __future__ import annotations


class TokenLedgerError(Exception):
    """Base of every error the server raises on purpose."""

    http_status = 500
    error_type = "server_error"


class InvalidRequestError(TokenLedgerError):
    """A request's body is wrong; `param` names the offending field."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelLoadError(TokenLedgerError):
    """The model directory cannot be served (missing files, unsupported architecture)."""


class ConfigError(TokenLedgerError):
    """A server argument is invalid."""


class EngineStoppedError(TokenLedgerError):
    """The engine was shut down, or its scheduler died."""

    http_status = 503
    error_type = "service_unavailable"
