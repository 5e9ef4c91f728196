"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Every response's `id` (and every stream chunk's) is the request's rid, so an operator can
look it up in the log and abort it. With n > 1 the choices run together as `{id}-{i}` in
the log (streamed interleaved, each chunk naming its `index`); aborting `id` aborts them
all, and a late abort of a finished `id` answers 409. Fields we do not implement are
refused by name.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.errors import InvalidRequestError
from server.grammar.spec import GrammarKind, GrammarSpec, check_syntax
from server.http.bodies import json_object, typed
from server.http.client import Submission
from server.http.front import AcceptedStream, Front, require_ready
from server.http.incremental import IncrementalText
from server.http.json_wire import JSONResponse
from server.http.native import SSE_DONE, sse
from server.http.openai_format import (
    chat_logprobs,
    completion_logprobs,
    echo_text,
    envelope,
    finish_reason,
    usage,
    whole_completion_logprobs,
)
from server.http.openai_sampling import SAMPLING_FIELDS, as_sent, sampling_fields
from server.request import RequestSpec
from server.request_builder import GenerateCall
from server.response import CommittedView

COMMON = frozenset({"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "n", "stream",
                    "stream_options", "user", "ignore_eos", "best_of"}) | SAMPLING_FIELDS
COMPLETION_FIELDS = COMMON | {"prompt", "logprobs", "echo", "suffix"}
CHAT_FIELDS = COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens", "response_format"}
MAX_N = 16
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    rid: str
    model: str
    kind: str  # "text_completion" or "chat.completion"
    specs: list[RequestSpec]
    logprobs: int | None  # top-k to report per token; None: no logprobs
    include_usage: bool
    echo: bool = False  # completions: the prompt comes back before the output (and its logprobs)
    prompt_texts: tuple[str, ...] = ()  # the prompts as sent, when sent as text (echoed verbatim)


def openai_router(front: Front) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": front.served_model_name, "object": "model", "created": 0,
                                            "owned_by": "tokenledger"}]}

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await json_object(request, COMPLETION_FIELDS)
        return await _respond(front, request, body, await front.off_loop(_completion_call, front, body))

    @router.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await json_object(request, CHAT_FIELDS)
        return await _respond(front, request, body, await front.off_loop(_chat_call, front, body))

    return router


# -- parsing ---------------------------------------------------------------------------
def _common(front: Front, body: dict[str, Any]) -> tuple[str, dict[str, Any], int]:
    model = typed(body, "model", str)
    if model is None:
        raise InvalidRequestError("model is required", "model")
    if model != front.served_model_name:
        raise InvalidRequestError(f"model {model!r} is not served here; use {front.served_model_name!r}", "model")
    # Benchmark clients send these at their neutral values; anything else would change the output.
    for name, neutral in (("best_of", 1),):
        if body.get(name) not in (None, neutral):
            raise InvalidRequestError(f"{name} other than {neutral} is not supported", name)
    n = typed(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise InvalidRequestError(f"n must be between 1 and {MAX_N}", "n")
    typed(body, "seed", int)  # each choice's seed is derived from it before SamplingParams checks them
    params = {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "ignore_eos")
              if body.get(k) is not None}
    return model, params | sampling_fields(body), n


def _completion_call(front: Front, body: dict[str, Any]) -> Call:
    model, params, n = _common(front, body)
    if body.get("suffix"):
        raise InvalidRequestError("suffix is not supported", "suffix")
    echo = typed(body, "echo", bool, False)
    params["max_new_tokens"] = typed(body, "max_tokens", int, 16)
    prompt = body.get("prompt")
    if prompt is None:
        raise InvalidRequestError("prompt is required", "prompt")
    if not isinstance(prompt, (str, list)):
        raise InvalidRequestError("prompt must be a string, a list of strings, a list of token ids or a list of "
                                  "such lists", "prompt")
    text, ids = (prompt, None) if isinstance(prompt, str) or _all_str(prompt) else (None, prompt)
    k = typed(body, "logprobs", int)
    if k is not None and not 0 <= k <= 20:
        raise InvalidRequestError("logprobs must be between 0 and 20", "logprobs")
    # echo with logprobs scores the prompt too (lm-eval's loglikelihood): from position 0, whose value is null.
    call = GenerateCall(prompt=text, input_ids=ids, logprob_start_len=0 if echo and k is not None else -1)
    built = _build(front, body, model, "text_completion", call, params, n, k)
    texts = (text,) if isinstance(text, str) else tuple(text or ())
    return replace(built, echo=echo, prompt_texts=texts)


def _chat_call(front: Front, body: dict[str, Any]) -> Call:
    model, params, n = _common(front, body)
    schema = _response_schema(typed(body, "response_format", dict))
    if schema is not None:
        if {"json_schema", "regex", "ebnf"} & params.keys():  # two constraints: neither may win silently
            raise InvalidRequestError("give response_format or one of json_schema, regex, ebnf, not both",
                                      "response_format")
        params["json_schema"] = schema
    prompt_ids = front.tokenizer.apply_chat_template(_messages(body.get("messages")))
    limit = typed(body, "max_completion_tokens", int) or typed(body, "max_tokens", int)
    builder = require_ready(front)
    params["max_new_tokens"] = limit if limit is not None else max(builder.limits.context_len - len(prompt_ids), 0)
    k = typed(body, "top_logprobs", int, 0) if typed(body, "logprobs", bool, False) else None
    if k is not None and not 0 <= k <= 20:
        raise InvalidRequestError("top_logprobs must be between 0 and 20", "top_logprobs")
    return _build(front, body, model, "chat.completion", GenerateCall(input_ids=prompt_ids), params, n, k)


def _response_schema(fmt: dict[str, Any] | None) -> str | None:
    """OpenAI's response_format as a JSON schema string (None: plain text)."""
    if fmt is None or fmt.get("type") in (None, "text"):
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind != "json_schema":
        raise InvalidRequestError("response_format.type must be text, json_object or json_schema", "response_format")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise InvalidRequestError("response_format.json_schema.schema must be a JSON schema object", "response_format")
    source = json.dumps(schema)
    try:
        check_syntax(GrammarSpec(GrammarKind.JSON_SCHEMA, source))
    except InvalidRequestError as exc:
        raise InvalidRequestError(f"response_format: {exc}", "response_format") from None
    return source


def _build(front: Front, body: dict[str, Any], model: str, kind: str, call: GenerateCall, params: dict[str, Any],
           n: int, k: int | None) -> Call:
    options = typed(body, "stream_options", dict, {})
    rid = f"{'cmpl' if kind == 'text_completion' else 'chatcmpl'}-{uuid.uuid4().hex}"
    call.return_logprob, call.top_logprobs_num = k is not None, k or 0
    builder = require_ready(front)
    prompts = len(call.prompt) if isinstance(call.prompt, list) else 1
    prompts = len(call.input_ids) if call.input_ids and isinstance(call.input_ids[0], list) else prompts
    cap = builder.limits.max_prompts
    builder.check_prompt_count(prompts * n, "n" if cap is not None and prompts <= cap else "prompt")
    specs: list[RequestSpec] = []
    for i in range(n):
        seeded = {**params, "seed": params["seed"] + i} if "seed" in params else params
        call.sampling_params, call.rid = seeded, None
        try:
            built, _ = builder.build(call)
        except InvalidRequestError as exc:
            raise as_sent(exc) from None
        specs.extend(built)
    specs = [RequestSpec(rid if len(specs) == 1 else f"{rid}-{i}", s.prompt_ids, s.params, s.logprob)
             for i, s in enumerate(specs)]
    return Call(rid, model, kind, specs, k, bool(options.get("include_usage")))


def _messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequestError("messages must be a non-empty array", "messages")
    out = []
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or set(m) - {"role", "content", "name"}:
            raise InvalidRequestError("each message needs a role (system|user|assistant) and content", "messages")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise InvalidRequestError("only text content parts are supported", "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise InvalidRequestError("message content must be a string", "messages")
        out.append({"role": m["role"], "content": content})
    return out


def _all_str(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


# -- responding ------------------------------------------------------------------------
async def _respond(front: Front, request: Request, body: dict[str, Any], call: Call) -> Response:
    stream = typed(body, "stream", bool, False)
    # Every choice is accepted at once, so an abort of the response id covers them all.
    group = call.rid if len(call.specs) > 1 else None
    submissions = front.accept(call.specs, group)
    if stream:
        return AcceptedStream(_stream(front, call, submissions), lambda: front.release(submissions, group))
    try:
        views = await front.collect(call.specs, request, submissions)
    finally:
        front.release(submissions, group)
    if views is None:
        return Response(status_code=499)
    choices = [_choice(front, call, i, v) for i, v in enumerate(views)]
    return JSONResponse(envelope(call.rid, call.kind, call.model, choices) | {"usage": usage(views)})


def _choice(front: Front, call: Call, index: int, view: CommittedView) -> dict[str, Any]:
    text = view.text(front.tokenizer)
    if call.kind == "text_completion":
        echoed = echo_text(view, front.tokenizer, call.prompt_texts, index) if call.echo else ""
        return {"index": index, "text": echoed + text, "finish_reason": finish_reason(view),
                "logprobs": None if call.logprobs is None else whole_completion_logprobs(view, front.tokenizer,
                                                                                        call.logprobs, call.echo)}
    logprobs = None if call.logprobs is None else chat_logprobs(view, front.tokenizer, 0, call.logprobs)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if front.args.reasoning_parser:
        message["content"] = view.text(front.tokenizer, view.reasoning_tokens)
        message["reasoning_content"] = view.reasoning_text(front.tokenizer) or None
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason(view)}


async def _stream(front: Front, call: Call, submissions: list[Submission]) -> AsyncIterator[bytes]:
    """The choices stream together, interleaved as their tokens commit; each chunk names its
    choice's `index` (as vLLM and SGLang do)."""
    chunk_kind = "text_completion" if call.kind == "text_completion" else "chat.completion.chunk"
    views = [CommittedView.for_spec(s) for s in call.specs]
    if call.kind != "text_completion":
        for index in range(len(views)):
            first = {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            yield sse(envelope(call.rid, chunk_kind, call.model, [first]))
    sources = [_choice_chunks(front, call, i, spec, view, sub)
               for i, (spec, view, sub) in enumerate(zip(call.specs, views, submissions))]
    async for piece in interleave(sources):
        yield sse(envelope(call.rid, chunk_kind, call.model, [piece]))
    if call.include_usage:
        yield sse(envelope(call.rid, chunk_kind, call.model, []) | {"usage": usage(views)})
    yield SSE_DONE


async def interleave(sources: list[AsyncGenerator[T, None]]) -> AsyncIterator[T]:
    """Items of several iterators in the order they arrive (ties in list order). Closing this
    generator cancels or closes every source, so each runs its own abort-on-disconnect."""
    pending = {asyncio.ensure_future(_next(source)): source for source in sources}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: sources.index(pending[t])):
                source = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(_next(source))] = source
                yield item
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for source in sources:
            await source.aclose()


async def _next(source: AsyncGenerator[T, None]) -> T:
    return await source.__anext__()


async def _choice_chunks(front: Front, call: Call, index: int, spec: RequestSpec, view: CommittedView,
                         submission: Submission) -> AsyncGenerator[dict[str, Any], None]:
    text = IncrementalText(front.tokenizer, spec.params.stop)
    thinking = IncrementalText(front.tokenizer, ()) if front.args.reasoning_parser else None
    sent_tokens = 0
    echo_due = call.echo  # the prompt rides on the first chunk, once its logprobs are all committed
    async for delta in front.stream(spec, view, submission):
        think = thinking.next_chunk(_Part(view, True)) if thinking else ""  # type: ignore[arg-type]
        chunk = text.next_chunk(_Part(view, False) if thinking else view)  # type: ignore[arg-type]
        if not (chunk or think) and delta.finish is None and not (call.logprobs is not None and delta.token_ids):
            continue
        piece: dict[str, Any] = {"index": index, "finish_reason": finish_reason(view)}
        if call.kind == "text_completion":
            piece["text"] = chunk
            piece["logprobs"] = (None if call.logprobs is None else
                                 completion_logprobs(view, front.tokenizer, sent_tokens, call.logprobs))
            if echo_due:  # nothing was sent yet: this chunk is the whole answer so far, prompt first
                piece["text"] = echo_text(view, front.tokenizer, call.prompt_texts, index) + chunk
                piece["logprobs"] = (None if call.logprobs is None else
                                     whole_completion_logprobs(view, front.tokenizer, call.logprobs, True))
                echo_due = False
        else:
            piece["delta"] = ({"content": chunk} if chunk else {}) | ({"reasoning_content": think} if think else {})
            piece["logprobs"] = (None if call.logprobs is None else
                                 chat_logprobs(view, front.tokenizer, sent_tokens, call.logprobs))
        sent_tokens = len(view.output_ids)
        yield piece


@dataclass(frozen=True)
class _Part:
    """One side of a reasoning response (thinking or answer), shaped for IncrementalText."""

    view: CommittedView
    reasoning: bool

    @property
    def finish(self) -> dict[str, Any] | None:
        return self.view.finish

    def text(self, tokenizer: Any) -> str:
        if self.reasoning:
            return self.view.reasoning_text(tokenizer)
        return self.view.text(tokenizer, self.view.reasoning_tokens)
