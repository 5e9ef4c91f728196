"""Bearer-key authentication as a plain ASGI middleware.

Not `BaseHTTPMiddleware`: that wrapper runs the route in a task of its own and hands it a
`receive` that never reports the client's disconnect, so a non-streaming request whose
client went away ran to its limit, and it adds a task hop to every streamed chunk.
"""
from __future__ import annotations

import hmac
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from server.http.errors import HttpError, error_response

OPEN_PATHS = frozenset({"/health"})


class BearerAuth:
    def __init__(self, app: ASGIApp, api_key: str | None, admin_key: str | None) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_key = admin_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.api_key and scope["path"] not in OPEN_PATHS:
            if not bearer_matches(Request(scope), self.api_key, self.admin_key):
                refusal = error_response(HttpError(401, "missing or wrong API key (Authorization: Bearer <key>)",
                                                   "authentication_error"))
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def bearer_matches(request: Any, *keys: str | None) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Constant-time comparisons, and all of them, so timing says nothing about which key is close.
    results = [hmac.compare_digest(token.encode(), key.encode()) for key in keys if key]
    return any(results)


def require_admin(request: Any, admin_key: str | None) -> None:
    """Admin routes (abort_all, the log's views) need the admin key when one is set."""
    if admin_key and not bearer_matches(request, admin_key):
        raise HttpError(401, "this route needs the admin API key", "authentication_error")
