"""A FastAPI app over an in-process `Engine` (the multi-process front replaces it later)."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from server.engine import Engine
from server.errors import InvalidRequestError, TokenLedgerError

GENERATE_FIELDS = ("text", "input_ids", "sampling_params", "return_logprob", "top_logprobs_num",
                   "logprob_start_len", "return_hidden_states", "rid", "stream")


def error_body(message: str, error_type: str, param: str | None, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="tokenledger")

    @app.exception_handler(TokenLedgerError)
    async def typed_error(_: Request, exc: TokenLedgerError) -> JSONResponse:
        param = getattr(exc, "param", None)
        return JSONResponse(error_body(str(exc), exc.error_type, param, exc.http_status), status_code=exc.http_status)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        body = await _json_object(request)
        unknown = sorted(set(body) - set(GENERATE_FIELDS))
        if unknown:
            raise InvalidRequestError(f"unknown field {unknown[0]!r}", unknown[0])
        if body.get("stream"):
            raise InvalidRequestError("stream is not supported by this server build yet", "stream")
        return await run_in_threadpool(
            engine.generate, prompt=body.get("text"), input_ids=body.get("input_ids"),
            sampling_params=body.get("sampling_params"), return_logprob=body.get("return_logprob", False),
            top_logprobs_num=body.get("top_logprobs_num", 0), logprob_start_len=body.get("logprob_start_len", -1),
            return_hidden_states=body.get("return_hidden_states", False), rid=body.get("rid"),
        )

    return app


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise InvalidRequestError(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object")
    return body
