"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`."""
from __future__ import annotations

from typing import Any

from server.errors import TokenLedgerError
from server.http.json_wire import JSONResponse


class HttpError(TokenLedgerError):
    """An HTTP-layer refusal with an explicit status (401, 404, 409, 413, 503, ...)."""

    def __init__(self, status: int, message: str, error_type: str, param: str | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.http_status = status
        self.error_type = error_type
        self.param = param
        self.extra = extra or {}


def error_response(exc: TokenLedgerError) -> JSONResponse:
    body: dict[str, Any] = {"error": {"message": str(exc), "type": exc.error_type,
                                      "param": getattr(exc, "param", None), "code": exc.http_status}}
    body["error"].update(getattr(exc, "extra", {}))
    return JSONResponse(body, status_code=exc.http_status)
