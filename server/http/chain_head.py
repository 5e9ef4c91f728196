"""GET /log/head: the log's chain head for a log pipeline or an operator to keep outside the log
directory; `tokenledger verify --expect-head LSN:HASH` later proves nothing at or before it changed."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from commitlog import ChainHead, CommitLogError, LogReader, read_head
from server.errors import EngineStoppedError, TokenLedgerError
from server.http.auth import require_admin
from server.http.errors import HttpError, error_response
from server.http.front import Front


def chain_head_router(front: Front) -> APIRouter:
    router = APIRouter()
    admin_key = front.args.admin_api_key or front.args.api_key

    @router.get("/log/head")
    async def log_head(request: Request) -> JSONResponse:
        try:
            require_admin(request, admin_key)
            # Off the event loop: opening LMDB and reading a record may touch the disk.
            head = await run_in_threadpool(_durable_head, front)
        except TokenLedgerError as exc:
            return error_response(exc)
        return JSONResponse(head.to_dict())

    return router


def _durable_head(front: Front) -> ChainHead:
    """The stored hash of the latest record the scheduler has reported durable (its stats carry the LSN):
    with durability `periodic` or `none` a reader can see records a power cut could still take back."""
    durable = front.metrics.durable_lsn_now()
    if durable <= 0:
        raise HttpError(503, "the scheduler has not reported a durable LSN yet; retry shortly", "unavailable")
    try:
        reader = LogReader.open(front.client.log_dir)
    except CommitLogError as exc:
        raise EngineStoppedError(f"the log cannot be read: {exc}") from exc
    try:
        head = read_head(reader, int(durable))
    except CommitLogError as exc:
        raise HttpError(500, f"the log's head cannot be read: {exc}", "corrupt_log") from exc
    finally:
        reader.close()
    if head is None:
        raise HttpError(503, "the log has no records yet", "unavailable")
    return head
