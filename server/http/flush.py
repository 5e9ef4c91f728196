"""`POST /flush_cache` (admin; GET too, as SGLang serves it): drop the prefix cache's KV.

The scheduler flushes only when no request is live (their KV is committed state); otherwise
the answer is 409. With `?timeout=S` (SGLang's parameter) the front asks again until the
scheduler is idle or S seconds have passed, so a benchmark's flush between runs succeeds
once the previous run's requests have drained.
"""
from __future__ import annotations

import asyncio
import math
import time

from fastapi import APIRouter, Request

from server.errors import InvalidRequestError
from server.http.auth import require_admin
from server.http.errors import HttpError
from server.http.front import Front
from server.http.json_wire import JSONResponse

RETRY_S = 0.05
MAX_TIMEOUT_S = 600.0


def flush_router(front: Front) -> APIRouter:
    router = APIRouter()
    admin_key = front.args.admin_api_key or front.args.api_key

    @router.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> JSONResponse:
        require_admin(request, admin_key)
        deadline = time.monotonic() + _timeout(request.query_params.get("timeout"))
        while True:
            reply = await front.client.flush_cache()
            if reply.flushed:
                return JSONResponse({"flushed": True, "message": "Cache flushed."})
            if time.monotonic() >= deadline:
                raise HttpError(409, f"the cache was not flushed: {reply.live_requests} request(s) are running or "
                                     "waiting; retry when they finish, or pass ?timeout=SECONDS to wait for them",
                                "conflict", None, {"live_requests": reply.live_requests})
            await asyncio.sleep(RETRY_S)

    return router


def _timeout(raw: str | None) -> float:
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_TIMEOUT_S:  # NaN fails this too
        raise InvalidRequestError(f"timeout must be a number of seconds in [0, {MAX_TIMEOUT_S:g}]", "timeout")
    return value
