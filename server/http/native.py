"""`POST /generate`: SGLang's native body, JSON or an SSE stream of cumulative chunks (a batch
streams its prompts together, each chunk naming its prompt's `index`, as SGLang does)."""
from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.api_fields import GENERATE
from server.http.bodies import json_object, typed
from server.http.client import Submission
from server.http.front import AcceptedStream, Front, require_ready
from server.http.json_wire import JSONResponse
from server.http.streams import SSE_DONE, interleave, sse
from server.request import RequestSpec
from server.request_builder import GenerateCall
from server.response import CommittedView, format_output

GENERATE_FIELDS = GENERATE.names
REQUEST_ID_HEADER = "x-request-id"


def request_id_header(rids: list[str]) -> dict[str, str]:
    """The rid(s) a response answers for, so a proxy log line leads to the request's log records."""
    return {REQUEST_ID_HEADER: ",".join(rids)}


def native_router(front: Front) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        body = await json_object(request, GENERATE)
        call = GenerateCall(
            prompt=body.get("text"), input_ids=body.get("input_ids"), sampling_params=body.get("sampling_params"),
            return_logprob=typed(body, "return_logprob", bool, False),
            top_logprobs_num=typed(body, "top_logprobs_num", int, 0),
            logprob_start_len=typed(body, "logprob_start_len", int, -1),
            return_hidden_states=typed(body, "return_hidden_states", bool, False), rid=body.get("rid"),
        )
        stream = typed(body, "stream", bool, False)
        specs, is_batch = await front.off_loop(require_ready(front).build, call)
        # Accepted now: from here an abort of these rids wins, even before the scheduler admits them.
        submissions = front.accept(specs)
        headers = request_id_header([s.rid for s in specs])
        if stream:
            chunks = _stream(front, specs, submissions, is_batch)
            return AcceptedStream(chunks, lambda: front.release(submissions), headers)
        try:
            views = await front.collect(specs, request, submissions)
        finally:
            front.release(submissions)
        if views is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        outputs = [format_output(v, front.tokenizer) for v in views]
        return JSONResponse(outputs if is_batch else outputs[0], headers=headers)

    return router


async def _stream(front: Front, specs: list[RequestSpec], submissions: list[Submission],
                  is_batch: bool) -> AsyncIterator[bytes]:
    sources = [_chunks(front, spec, sub, i if is_batch else None) for i, (spec, sub) in enumerate(zip(specs, submissions))]
    async for chunk in interleave(sources):
        yield sse(chunk)
    yield SSE_DONE


async def _chunks(front: Front, spec: RequestSpec, submission: Submission,
                  index: int | None) -> AsyncGenerator[dict[str, Any], None]:
    view = CommittedView.for_spec(spec)
    async for delta in front.stream(spec, view, submission):
        if delta.token_ids or delta.finish is not None:
            out = format_output(view, front.tokenizer)
            yield out if index is None else out | {"index": index}
