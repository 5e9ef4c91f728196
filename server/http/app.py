"""The FastAPI app: auth, error bodies, health, metrics, abort, the log's view, and the
native and OpenAI routers."""
from __future__ import annotations

import asyncio
import traceback
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from commitlog import CommitLogError, CorruptRecordError, LogReader
from commitlog.errors import SALVAGE_HINT
from commitlog.rids import rid_problem
from server.errors import EngineStoppedError, InvalidRequestError, TokenLedgerError
from server.http.auth import BearerAuth, require_admin
from server.http.bodies import json_object, typed
from server.http.chain_head import chain_head_router
from server.http.errors import HttpError, error_response
from server.http.flush import flush_router
from server.http.front import Front
from server.http.json_wire import JSONResponse
from server.http.native import native_router
from server.http.openai_api import openai_router
from server.outputs import AbortAnswer, AbortStatus

log = structlog.get_logger("tokenledger.http")
LOGGED_FRAMES = 12  # innermost frames of an unexpected error's traceback
MAX_LOGGED_ERROR_CHARS = 500


def create_app(front: Front) -> FastAPI:
    app = FastAPI(title="tokenledger", docs_url=None, redoc_url=None)
    api_key, admin_key = front.args.api_key, front.args.admin_api_key or front.args.api_key
    _add_error_handlers(app)
    app.add_middleware(BearerAuth, api_key=api_key, admin_key=admin_key)
    _add_admin_routes(app, front, admin_key)
    app.include_router(native_router(front))
    app.include_router(chain_head_router(front))
    app.include_router(openai_router(front))
    app.include_router(flush_router(front))
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal, ours or the router's (no such route: 404, wrong method: 405), is the OpenAI
    error body; never FastAPI's `{"detail"}`."""

    @app.exception_handler(TokenLedgerError)
    async def typed_error(_: Request, exc: TokenLedgerError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # The router's own refusals (no such route, wrong method) in the same error body as ours.
        error_type = "not_found" if exc.status_code == 404 else "invalid_request_error"
        response = error_response(HttpError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}",
                                            error_type))
        response.headers.update(exc.headers or {})  # 405's Allow
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Never log.exception here: the console renderer draws the traceback with every frame's
        # locals, which held the event loop for seconds per bad request. A plain, bounded traceback.
        log.error("unhandled_error", path=request.url.path, error=repr(exc)[:MAX_LOGGED_ERROR_CHARS],
                  traceback="".join(traceback.format_exception(exc, limit=-LOGGED_FRAMES)))
        return error_response(TokenLedgerError(f"internal error: {type(exc).__name__}"))


def _add_admin_routes(app: FastAPI, front: Front, admin_key: str | None) -> None:
    """Health, metrics, abort and the log's view of one request."""

    @app.get("/health")
    async def health() -> JSONResponse:
        if front.is_serving:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable", "reason": front.client.failure or "starting or draining"},
                            status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(front.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> JSONResponse:
        body = await json_object(request, frozenset({"rid", "abort_all"}))
        if typed(body, "abort_all", bool, False):
            require_admin(request, admin_key)
            answers = await front.client.abort([], "api", abort_all=True)
            return JSONResponse({"aborted": [a.to_dict() for a in answers]})
        rid = typed(body, "rid", str)
        if not rid:
            raise InvalidRequestError("rid is required (or abort_all: true)", "rid")
        return _abort_response(rid, await front.abort(rid, "api"), str(front.client.log_dir))

    # `:path`, so a rid holding "/" (sent as %2F or as is) reads back like any other.
    @app.get("/requests/{rid:path}")
    async def request_view(rid: str, request: Request) -> JSONResponse:
        require_admin(request, admin_key)
        if (problem := rid_problem(rid)) is not None:  # no such key can be in the log (nor looked up there)
            raise InvalidRequestError(problem, "rid")
        # Off the event loop: a long request's records take a while to decode.
        view = await asyncio.to_thread(_read_audit, front, rid)
        if view is None:
            raise HttpError(404, f"the log has no request {rid!r}", "not_found", "rid")
        durable_time = front.client.abort_durable_times.get(rid)
        if durable_time is not None and (view.get("finish_reason") or {}).get("type") == "abort":
            view["abort_durable_time"] = durable_time  # wall clock (s) when its abort's finish was durable
        return JSONResponse(view)


def _abort_response(rid: str, answers: list[AbortAnswer], front_log_dir: str) -> JSONResponse:
    if any(a.status is AbortStatus.ABORTED for a in answers):
        aborted = [a for a in answers if a.status is AbortStatus.ABORTED]
        body = aborted[0].to_dict() if len(answers) == 1 else {
            "rid": rid, "status": "aborted", "completion_tokens": sum(a.completion_tokens for a in aborted),
            "lsn": max(a.lsn or 0 for a in aborted), "choices": [a.to_dict() for a in answers]}
        return JSONResponse(body)
    corrupt = [a for a in answers if a.status is AbortStatus.CORRUPT]
    if corrupt:
        raise corrupt_log_error(rid, corrupt[0].detail or "its records are damaged", front_log_dir)
    done = [a for a in answers if a.status is AbortStatus.ALREADY_FINISHED]
    if done:
        raise HttpError(409, f"request {rid!r} had already finished", "conflict", "rid",
                        {"finish_reason": done[0].finish, "completion_tokens": done[0].completion_tokens})
    raise HttpError(404, f"no request {rid!r} is known", "not_found", "rid")


def _read_audit(front: Front, rid: str) -> dict[str, Any] | None:
    try:
        reader = LogReader.open(front.client.log_dir)
    except CommitLogError as exc:
        raise EngineStoppedError(f"the log cannot be read: {exc}") from exc
    from commitlog.audit import audit_request

    try:
        return audit_request(reader, rid)
    except CorruptRecordError as exc:
        raise corrupt_log_error(rid, str(exc), str(front.client.log_dir)) from exc
    finally:
        reader.close()


def corrupt_log_error(rid: str, detail: str, log_dir: str) -> HttpError:
    """The request is in the log but its records fail their checks: not unknown (404) and not a
    server bug (500). 409: the stored state conflicts with its own checksums; the fix is a salvage."""
    return HttpError(409, f"the log's records of request {rid!r} are corrupt ({detail}); copy out every intact "
                          f"record with `{SALVAGE_HINT.format(log_dir=log_dir)}` and serve from the copy",
                     "corrupt_log", "rid")
