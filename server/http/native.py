"""`POST /generate`: SGLang's native body, JSON or an SSE stream of cumulative chunks."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.errors import InvalidRequestError
from server.http.bodies import json_object, typed
from server.http.client import Submission
from server.http.front import AcceptedStream, Front, require_ready
from server.http.json_wire import JSONResponse, dumps
from server.request import RequestSpec
from server.request_builder import GenerateCall
from server.response import CommittedView, format_output

GENERATE_FIELDS = frozenset({"text", "input_ids", "sampling_params", "return_logprob", "top_logprobs_num",
                             "logprob_start_len", "return_hidden_states", "stream", "rid"})


def sse(payload: Any) -> bytes:
    return f"data: {dumps(payload)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def native_router(front: Front) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        body = await json_object(request, GENERATE_FIELDS)
        call = GenerateCall(
            prompt=body.get("text"), input_ids=body.get("input_ids"), sampling_params=body.get("sampling_params"),
            return_logprob=typed(body, "return_logprob", bool, False),
            top_logprobs_num=typed(body, "top_logprobs_num", int, 0),
            logprob_start_len=typed(body, "logprob_start_len", int, -1),
            return_hidden_states=typed(body, "return_hidden_states", bool, False), rid=body.get("rid"),
        )
        stream = typed(body, "stream", bool, False)
        specs, is_batch = await front.off_loop(require_ready(front).build, call)
        if stream and is_batch:
            raise InvalidRequestError("stream is supported for one prompt at a time", "stream")
        # Accepted now: from here an abort of these rids wins, even before the scheduler admits them.
        submissions = front.accept(specs)
        if stream:
            return AcceptedStream(_stream(front, specs[0], submissions[0]), lambda: front.release(submissions))
        try:
            views = await front.collect(specs, request, submissions)
        finally:
            front.release(submissions)
        if views is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        outputs = [format_output(v, front.tokenizer) for v in views]
        return JSONResponse(outputs if is_batch else outputs[0])

    return router


async def _stream(front: Front, spec: RequestSpec, submission: Submission) -> AsyncIterator[bytes]:
    view = CommittedView.for_spec(spec)
    async for delta in front.stream(spec, view, submission):
        if delta.token_ids or delta.finish is not None:
            yield sse(format_output(view, front.tokenizer))
    yield SSE_DONE
