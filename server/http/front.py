"""The front's state: the scheduler link, the tokenizer, validation, metrics, and the
request helpers every route uses (stream deltas, collect results, abort on disconnect)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog
from starlette.requests import Request

from server.config import ServerArgs
from server.errors import EngineStoppedError
from server.http.client import SchedulerClient
from server.http.errors import HttpError
from server.http.metrics import Metrics
from server.outputs import AbortAnswer, RequestDelta
from server.request import RequestSpec
from server.request_builder import Limits, RequestBuilder
from server.response import CommittedView
from server.tokenizer import Tokenizer

log = structlog.get_logger("tokenledger.requests")
DISCONNECT_POLL_S = 0.05
LOGGED_TEXT_CHARS = 200  # --log-requests-level 2 cuts logged text here; 3 logs it whole


@dataclass
class Front:
    args: ServerArgs
    client: SchedulerClient
    tokenizer: Tokenizer
    served_model_name: str
    metrics: Metrics = field(default_factory=Metrics)
    builder: RequestBuilder | None = None
    draining: bool = False
    # OpenAI n > 1: one response id stands for several scheduler requests.
    groups: dict[str, list[str]] = field(default_factory=dict)
    _background: set[asyncio.Task[object]] = field(default_factory=set)

    def on_ready(self) -> None:
        ready = self.client.ready
        assert ready is not None
        limits = Limits(ready.vocab_size, ready.context_len, ready.kv_capacity)
        self.builder = RequestBuilder(self.tokenizer, limits, self.args.random_seed)
        self.client.on_stats.append(self.metrics.on_stats)

    @property
    def is_serving(self) -> bool:
        return self.client.is_healthy and not self.draining

    def check_rids_free(self, specs: list[RequestSpec]) -> None:
        """A client-chosen rid that names a live request is a conflict (409), decided up front."""
        for spec in specs:
            if self.client.is_live(spec.rid) or spec.rid in self.groups:
                raise HttpError(409, f"rid {spec.rid!r} is already in use by a live request", "conflict", "rid")

    def expand(self, rid: str) -> list[str]:
        return self.groups.get(rid, [rid])

    # -- one request ----------------------------------------------------------------
    async def stream(self, spec: RequestSpec, view: CommittedView) -> AsyncIterator[RequestDelta]:
        """Durable deltas of one request, applied to `view`; aborts it if the caller goes away."""
        arrival, first = time.monotonic(), True
        finished = False
        try:
            async for delta in self.client.generate(spec):
                view.apply(delta)
                if first and delta.token_ids:
                    self.metrics.ttft.observe(time.monotonic() - arrival)
                    first = False
                finished = delta.finish is not None
                yield delta
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away mid-stream: abort at once, with source `disconnect`.
            if not finished and self.client.is_healthy:
                self._spawn(self.client.abort([spec.rid], "disconnect"))
            raise
        finally:
            view.e2e_latency = time.monotonic() - arrival
            if finished:
                self._log_finish(view, spec)

    async def collect(self, specs: list[RequestSpec], request: Request) -> list[CommittedView] | None:
        """Runs requests to the end; None if the client disconnected (they are aborted then)."""
        views = [CommittedView(s.rid, s.prompt_ids, s.logprob, s.params.skip_special_tokens) for s in specs]
        work: asyncio.Future[list[None]] = asyncio.ensure_future(
            asyncio.gather(*(self._drain(s, v) for s, v in zip(specs, views))))
        watcher: asyncio.Future[None] = asyncio.ensure_future(_wait_disconnect(request))
        racing: list[asyncio.Future[Any]] = [work, watcher]
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            watcher.cancel()
            work.result()  # re-raises a scheduler failure or a rejection
            return views
        await self.client.abort([s.rid for s in specs], "disconnect")
        await asyncio.gather(work, return_exceptions=True)
        return None

    async def _drain(self, spec: RequestSpec, view: CommittedView) -> None:
        async for _ in self.stream(spec, view):
            pass

    async def abort(self, rid: str, source: str) -> list[AbortAnswer]:
        return await self.client.abort(self.expand(rid), source)

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task: asyncio.Task[object] = asyncio.ensure_future(coro)
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


async def _wait_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


def require_ready(front: Front) -> RequestBuilder:
    if not front.is_serving or front.builder is None:
        raise EngineStoppedError("the server is not accepting requests (starting, draining or failed)")
    return front.builder
