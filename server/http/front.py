"""The front's state: the scheduler link, the tokenizer, validation, metrics, and the
request helpers every route uses (stream deltas, collect results, abort on disconnect)."""
from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from starlette.requests import Request
from starlette.responses import StreamingResponse

from server.config import ServerArgs
from server.errors import EngineStoppedError
from server.http.client import SchedulerClient, Submission
from server.http.errors import HttpError
from server.http.metrics import Metrics, RequestTiming
from server.outputs import AbortAnswer, RequestDelta
from server.request import RequestSpec
from server.request_builder import Limits, RequestBuilder
from server.response import CommittedView
from server.tokenizer import Tokenizer

log = structlog.get_logger("tokenledger.requests")
DISCONNECT_POLL_S = 0.05
LOGGED_TEXT_CHARS = 200  # --log-requests-level 2 cuts logged text here; 3 logs it whole
# Finished n > 1 response ids remembered so a late abort answers 409: ~16 rids of ~40 bytes
# each, so 4,096 ids cost well under 4 MB. Older ids answer 404; their members `{id}-{i}`
# stay abortable (409) by name, since the scheduler resolves a finished rid through the log.
FINISHED_GROUPS_KEPT = 4096
WORK_THREADS = 2
T = TypeVar("T")


@dataclass
class Front:
    args: ServerArgs
    client: SchedulerClient
    tokenizer: Tokenizer
    served_model_name: str
    metrics: Metrics = field(init=False)
    builder: RequestBuilder | None = None
    draining: bool = False
    # OpenAI n > 1: one response id stands for several scheduler requests (live ones here,
    # the last FINISHED_GROUPS_KEPT finished ones in finished_groups).
    groups: dict[str, list[str]] = field(default_factory=dict)
    finished_groups: OrderedDict[str, list[str]] = field(default_factory=OrderedDict)
    _background: set[asyncio.Future[object]] = field(default_factory=set)
    # Per-request work (tokenizing, chat templates, building specs) runs here, never on the
    # event loop: a large batch must not stall /health or other clients' streams.
    _work: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(WORK_THREADS, thread_name_prefix="tokenledger-build"))

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.served_model_name, self.args.enable_metrics_sglang_names)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._work, functools.partial(fn, *args))

    def on_ready(self) -> None:
        ready = self.client.ready
        assert ready is not None
        limits = Limits(ready.vocab_size, ready.context_len, ready.kv_capacity, self.args.max_prompts_per_request)
        self.builder = RequestBuilder(self.tokenizer, limits, self.args.random_seed)
        self.client.on_stats.append(self.metrics.on_stats)
        self.client.on_abort_finished.append(self.metrics.on_abort_finished)

    @property
    def is_serving(self) -> bool:
        return self.client.is_healthy and not self.draining

    def check_rids_free(self, specs: list[RequestSpec]) -> None:
        """A client-chosen rid that names a live request is a conflict (409), decided up front."""
        for spec in specs:
            if self.client.is_live(spec.rid) or spec.rid in self.groups:
                raise HttpError(409, f"rid {spec.rid!r} is already in use by a live request", "conflict", "rid")

    def accept(self, specs: list[RequestSpec], group: str | None = None) -> list[Submission]:
        """Accepts requests now: from here on an abort of any of them (or of `group`, the
        response id that stands for them all) wins, because each generate is already queued
        ahead of any abort on the scheduler link. Call it last, once the body is fully checked."""
        self.check_rids_free(specs)
        if group is not None and group in self.groups:
            raise HttpError(409, f"rid {group!r} is already in use by a live request", "conflict", "rid")
        submissions: list[Submission] = []
        try:
            for spec in specs:
                submissions.append(self.client.submit(spec))
        except BaseException:
            self.abandon(submissions)  # a later member was refused: none of the group may run alone
            raise
        if group is not None:
            self.groups[group] = [s.rid for s in specs]
        return submissions

    def release(self, submissions: list[Submission], group: str | None = None) -> None:
        """The response is over: abort what nobody reads any more, and retire the group id."""
        self.abandon(submissions)
        if group is not None and (members := self.groups.pop(group, None)) is not None:
            self.finished_groups[group] = members
            while len(self.finished_groups) > FINISHED_GROUPS_KEPT:
                self.finished_groups.popitem(last=False)

    def abandon(self, submissions: list[Submission]) -> None:
        """Aborts (source `disconnect`) every submission not finished and not abandoned yet."""
        rids = [s.rid for s in submissions if not (s.finished or s.abandoned)]
        for s in submissions:
            s.abandoned = True
        if rids and self.client.is_healthy:
            # Sent now; only the wait for the answers (which nobody reads) is left to a task.
            self._spawn(self.client.send_abort(rids, "disconnect"))

    def expand(self, rid: str) -> list[str]:
        """The rids an abort of `rid` stands for: a live group, a live request, or a finished
        group (kept so that a late abort of it answers 409 "already finished", not 404)."""
        if rid in self.groups:
            return self.groups[rid]
        if self.client.is_live(rid):
            return [rid]
        return self.finished_groups.get(rid, [rid])

    # -- one request ----------------------------------------------------------------
    async def stream(self, spec: RequestSpec, view: CommittedView,
                     submission: Submission | None = None) -> AsyncIterator[RequestDelta]:
        """Durable deltas of one request, applied to `view`; aborts it if the caller goes away.
        Pass the `submission` from `accept`; without one the request is submitted only when
        this generator is first iterated (an abort before that finds no request)."""
        timing = RequestTiming(time.monotonic())
        if submission is None:
            submission = self.accept([spec])[0]
        try:
            async for delta in self.client.follow(submission):
                view.apply(delta)
                now = time.monotonic()
                # Filled on every chunk, not only the last: a streamed chunk reports its own latency.
                view.e2e_latency = now - timing.arrival
                self.metrics.on_tokens(timing, now, len(delta.token_ids))
                yield delta
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away mid-stream: abort at once, with source `disconnect`.
            self.abandon([submission])
            raise
        finally:
            view.e2e_latency = time.monotonic() - timing.arrival
            if view.finish is not None:
                self.metrics.on_finish(view.e2e_latency, len(view.prompt_ids), len(view.output_ids),
                                       str(view.finish.get("type")))
                self._log_finish(view, spec)

    async def collect(self, specs: list[RequestSpec], request: Request,
                      submissions: list[Submission] | None = None) -> list[CommittedView] | None:
        """Runs requests to the end; None if the client disconnected (they are aborted then)."""
        if submissions is None:
            submissions = self.accept(specs)
        views = [CommittedView.for_spec(s) for s in specs]
        work: asyncio.Future[list[None]] = asyncio.ensure_future(
            asyncio.gather(*(self._drain(s, v, sub) for s, v, sub in zip(specs, views, submissions))))
        watcher: asyncio.Future[None] = asyncio.ensure_future(_wait_disconnect(request))
        racing: list[asyncio.Future[Any]] = [work, watcher]
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if work.done():
            work.result()  # re-raises a scheduler failure or a rejection
            return views
        unfinished = [s for s in submissions if not (s.finished or s.abandoned)]
        for s in unfinished:
            s.abandoned = True
        if unfinished:
            await self.client.abort([s.rid for s in unfinished], "disconnect")
        await asyncio.gather(work, return_exceptions=True)
        return None

    async def _drain(self, spec: RequestSpec, view: CommittedView, submission: Submission) -> None:
        async for _ in self.stream(spec, view, submission):
            pass

    async def abort(self, rid: str, source: str) -> list[AbortAnswer]:
        return await self.client.abort(self.expand(rid), source)

    def _spawn(self, awaitable: Coroutine[Any, Any, object] | asyncio.Future[Any]) -> None:
        task: asyncio.Future[object] = asyncio.ensure_future(awaitable)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _log_finish(self, view: CommittedView, spec: RequestSpec) -> None:
        fields: dict[str, Any] = {
            "rid": view.rid, "prompt_tokens": len(view.prompt_ids), "completion_tokens": len(view.output_ids),
            "finish_reason": (view.finish or {}).get("type"), "latency_s": round(view.e2e_latency, 4)}
        level = self.args.log_requests_level if self.args.log_requests else -1
        if level >= 1:
            fields["sampling_params"] = spec.params.to_dict()
        if level >= 2:
            limit = None if level >= 3 else LOGGED_TEXT_CHARS
            fields["prompt"] = self.tokenizer.decode(view.prompt_ids)[:limit]
            fields["output"] = view.text(self.tokenizer)[:limit]
        log.info("request_finished", **fields)


class AcceptedStream(StreamingResponse):
    """An SSE response over requests accepted before it started. However its ASGI call ends
    (done, client gone before the body began or mid-way, server stopping), `release` runs, so
    an accepted request is never left running with nobody to read it."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def receive_and_release_on_disconnect() -> Any:
            message = await receive()
            if message["type"] == "http.disconnect":
                # The abort goes now, where the disconnect is first seen, not after the body's task
                # has been cancelled: on a busy front that cascade took a loop turn or two more.
                self._release()
            return message

        try:
            await super().__call__(scope, receive_and_release_on_disconnect, send)
        finally:
            self._release()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()  # a body left at a yield: let its own cleanup run now, not at GC


async def _wait_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


def require_ready(front: Front) -> RequestBuilder:
    if not front.is_serving or front.builder is None:
        raise EngineStoppedError("the server is not accepting requests (starting, draining or failed)")
    return front.builder
