"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Every response's `id` (and every stream chunk's) is the request's rid, so an operator can
look it up in the log and abort it. With n > 1 the choices run together as `{id}-{i}` in
the log (streamed interleaved, each chunk naming its `index`); aborting `id` aborts them
all, and a late abort of a finished `id` answers 409. Which fields are implemented, taken only
at their neutral value, or refused is stated once, in `server.http.openai_fields`.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from commitlog.rids import rid_problem
from server.errors import InvalidRequestError
from server.grammar.spec import GrammarKind, GrammarSpec, check_syntax
from server.http.bodies import json_object, typed
from server.http.chat_messages import parse_messages, template_kwargs
from server.http.client import Submission
from server.http.errors import HttpError
from server.http.front import AcceptedStream, Front, require_ready
from server.http.incremental import IncrementalText
from server.http.json_wire import JSONResponse
from server.http.native import request_id_header
from server.http.openai_fields import CHAT, COMPLETIONS
from server.http.openai_format import (
    chat_logprobs,
    completion_logprobs,
    echo_text,
    envelope,
    finish_reason,
    usage,
    whole_completion_logprobs,
)
from server.http.openai_sampling import as_sent, sampling_fields
from server.http.streams import SSE_DONE, interleave, sse
from server.request import RequestSpec
from server.request_builder import GenerateCall
from server.response import CommittedView

COMPLETION_FIELDS = COMPLETIONS.names
CHAT_FIELDS = CHAT.names
MAX_N = 16
# Body fields passed to SamplingParams under the same name (the OpenAI routes take SGLang's extras too).
PASSED_AS_IS = ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "ignore_eos", "stop_token_ids",
                "skip_special_tokens", "regex", "json_schema", "ebnf")
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")


@dataclass(frozen=True)
class Call:
    rid: str
    model: str
    kind: str  # "text_completion" or "chat.completion"
    specs: list[RequestSpec]
    logprobs: int | None  # top-k to report per token; None: no logprobs
    include_usage: bool  # a last chunk with the usage of the whole response
    continuous_usage: bool  # every chunk carries the usage so far
    echo: bool = False  # completions: the prompt comes back before the output (and its logprobs)
    prompt_texts: tuple[str, ...] = ()  # the prompts as sent, when sent as text (echoed verbatim)


def openai_router(front: Front) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(front)]}

    # `:path`: a served name may hold "/" (an organisation/model id), as the OpenAI SDK sends it.
    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != front.served_model_name:
            raise HttpError(404, f"the model {model_id!r} does not exist here; this server serves "
                                 f"{front.served_model_name!r}", "not_found", "model")
        return _model_card(front)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await json_object(request, COMPLETIONS)
        return await _respond(front, request, body, await front.off_loop(_completion_call, front, body))

    @router.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await json_object(request, CHAT)
        return await _respond(front, request, body, await front.off_loop(_chat_call, front, body))

    return router


def _model_card(front: Front) -> dict[str, Any]:
    return {"id": front.served_model_name, "object": "model", "created": 0, "owned_by": "tokenledger"}


# -- parsing ---------------------------------------------------------------------------
def _common(front: Front, body: dict[str, Any]) -> tuple[str, dict[str, Any], int]:
    model = typed(body, "model", str)
    if model is None:
        raise InvalidRequestError("model is required", "model")
    if model != front.served_model_name:
        raise InvalidRequestError(f"model {model!r} is not served here; use {front.served_model_name!r}", "model")
    n = typed(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise InvalidRequestError(f"n must be between 1 and {MAX_N}", "n")
    typed(body, "seed", int)  # each choice's seed is derived from it before SamplingParams checks them
    typed(body, "user", str)
    params = {k: body[k] for k in PASSED_AS_IS if body.get(k) is not None}
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
    messages = parse_messages(body.get("messages"))
    prompt_ids = front.tokenizer.apply_chat_template(messages, template_kwargs(body.get("chat_template_kwargs")))
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
    options = _stream_options(body)
    rid = _client_rid(body) or f"{'cmpl' if kind == 'text_completion' else 'chatcmpl'}-{uuid.uuid4().hex}"
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
    return Call(rid, model, kind, specs, k, options["include_usage"], options["continuous_usage_stats"])


def _client_rid(body: dict[str, Any]) -> str | None:
    """SGLang's `rid` on the OpenAI routes: the response id (and the log's key) a client chose."""
    rid = typed(body, "rid", str)
    if rid is not None and (problem := rid_problem(rid)) is not None:
        raise InvalidRequestError(problem, "rid")
    return rid


def _stream_options(body: dict[str, Any]) -> dict[str, bool]:
    options = typed(body, "stream_options", dict, {})
    unknown = sorted(set(options) - set(STREAM_OPTIONS))
    if unknown:
        raise InvalidRequestError(f"stream_options has no option {unknown[0]!r} (known: {', '.join(STREAM_OPTIONS)})",
                                  "stream_options")
    if not all(isinstance(options.get(k, False), bool) for k in STREAM_OPTIONS):
        raise InvalidRequestError("stream_options values must be booleans", "stream_options")
    return {k: bool(options.get(k, False)) for k in STREAM_OPTIONS}


def _all_str(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


# -- responding ------------------------------------------------------------------------
async def _respond(front: Front, request: Request, body: dict[str, Any], call: Call) -> Response:
    stream = typed(body, "stream", bool, False)
    # Every choice is accepted at once, so an abort of the response id covers them all.
    group = call.rid if len(call.specs) > 1 else None
    submissions = front.accept(call.specs, group)
    headers = request_id_header([call.rid])
    if stream:
        return AcceptedStream(_stream(front, call, submissions), lambda: front.release(submissions, group), headers)
    try:
        views = await front.collect(call.specs, request, submissions)
    finally:
        front.release(submissions, group)
    if views is None:
        return Response(status_code=499)
    choices = [_choice(front, call, i, v) for i, v in enumerate(views)]
    return JSONResponse(envelope(call.rid, call.kind, call.model, choices) | {"usage": usage(views)}, headers=headers)


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


    def chunk(pieces: list[dict[str, Any]]) -> bytes:
        return sse(envelope(call.rid, chunk_kind, call.model, pieces) | (
            {"usage": usage(views)} if call.continuous_usage else {}))

    if call.kind != "text_completion":
        for index in range(len(views)):
            yield chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    sources = [_choice_chunks(front, call, i, spec, view, sub)
               for i, (spec, view, sub) in enumerate(zip(call.specs, views, submissions))]
    async for piece in interleave(sources):
        yield chunk([piece])
    if call.include_usage:
        yield sse(envelope(call.rid, chunk_kind, call.model, []) | {"usage": usage(views)})
    yield SSE_DONE


async def _choice_chunks(front: Front, call: Call, index: int, spec: RequestSpec, view: CommittedView,
                         submission: Submission) -> AsyncGenerator[dict[str, Any], None]:
    text = IncrementalText(front.tokenizer, spec.params.stop)
    thinking = IncrementalText(front.tokenizer, ()) if front.args.reasoning_parser else None
    sent_tokens = 0
    echo_due = call.echo  # the prompt rides on the first chunk, once its logprobs are all committed
    async for delta in front.stream(spec, view, submission):
        think = thinking.next_chunk(_Part(view, True)) if thinking else ""  # type: ignore[arg-type]
        chunk = text.next_chunk(_Part(view, False) if thinking else view)  # type: ignore[arg-type]
        # Every committed token gets its chunk, even while its text is held back (a partial UTF-8
        # character, a possible stop string): a client times the first token by the first chunk (vLLM
        # streams this way; so does our /generate). A delta without tokens (a prompt chunk's progress)
        # gets none.
        if not (chunk or think or delta.token_ids) and delta.finish is None:
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
