"""An open-loop load generator for any OpenAI-compatible `/v1/completions`: streamed requests
at a Poisson rate or a fixed concurrency, with per-request timings, and aborts at random
times (by `/abort_request` or by disconnect). An API abort's latency runs from the call to the
final chunk; a disconnect's from the client's close to the moment the server made the abort's
finish durable (tokenledger's `abort_durable_time`; both wall clocks of this machine)."""
from __future__ import annotations

import asyncio
import enum
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

ABORT_POLL_S = 0.05  # after the load: only a disconnect still being aborted is asked again
NO_DURABLE_TIME_S = 2.0  # a logged abort whose durable time the server has not given by then: none
# aiohttp, as `vllm bench serve` uses: under a 2-core load, httpx's streaming path took enough CPU
# from the server it measured that the two clients disagreed by 20-40 % on the same load.


class AbortWay(enum.Enum):
    NONE = "none"
    API = "api"  # POST /abort_request {"rid": id}
    DISCONNECT = "disconnect"  # the client closes the stream


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    prompt: str
    prompt_tokens: int
    max_tokens: int
    abort: AbortWay = AbortWay.NONE
    abort_after_s: float = 0.0  # from the first token


@dataclass(slots=True)
class RequestTiming:
    """What one request did, seen from the client."""

    ok: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    aborted_by: AbortWay = AbortWay.NONE
    abort_latency_s: float | None = None  # abort call -> final chunk; close -> abort durable, for a disconnect
    rid: str | None = None  # the server's id for it (from its chunks)
    closed_at: float | None = None  # wall clock of a disconnect's close

    @property
    def tpot_s(self) -> float | None:
        return None if self.output_tokens < 2 else (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class LoadConfig:
    base_url: str
    model: str
    request_rate: float = float("inf")  # requests/s, Poisson arrivals; inf: all at once
    max_concurrency: int | None = None
    api_key: str | None = None
    seed: int = 0
    ignore_eos: bool = True
    temperature: float | None = 0.0  # None: not sent (the server's default, as `vllm bench serve` does)


async def run_load(cfg: LoadConfig, plan: list[PlannedRequest],
                   on_done: Callable[[RequestTiming], None] = lambda _t: None) -> tuple[list[RequestTiming], float]:
    """Sends every planned request; returns their timings (in plan order) and the wall time."""
    headers = {"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    gate = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    rng = random.Random(cfg.seed)
    connector = aiohttp.TCPConnector(limit=0)  # no pool cap: the gate (or the rate) shapes the load
    timeout = aiohttp.ClientTimeout(total=600, connect=30)
    async with aiohttp.ClientSession(cfg.base_url, headers=headers, connector=connector, timeout=timeout) as client:
        started = time.perf_counter()
        tasks = []
        for i, req in enumerate(plan):
            if i and cfg.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(cfg.request_rate))
            tasks.append(asyncio.create_task(_gated(client, cfg, req, gate, on_done)))
        timings = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - started
        # Asked once the load is over: polling the log view during the run took the front's CPU from
        # the streams it measured (an API abort's final chunk waited up to ~0.8 s behind those reads).
        for timing in timings:
            if timing.aborted_by is AbortWay.DISCONNECT and timing.rid and timing.closed_at is not None:
                timing.abort_latency_s = await _durable_abort_latency(client, timing.rid, timing.closed_at)
        return timings, duration


async def _gated(client: aiohttp.ClientSession, cfg: LoadConfig, req: PlannedRequest, gate: asyncio.Semaphore | None,
                 on_done: Callable[[RequestTiming], None]) -> RequestTiming:
    if gate is None:
        timing = await _one(client, cfg, req)
    else:
        async with gate:
            timing = await _one(client, cfg, req)
    on_done(timing)
    return timing


async def _one(client: aiohttp.ClientSession, cfg: LoadConfig, req: PlannedRequest) -> RequestTiming:
    body = {"model": cfg.model, "prompt": req.prompt, "max_tokens": req.max_tokens, "stream": True,
            "ignore_eos": cfg.ignore_eos, "stream_options": {"include_usage": True}}
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    timing = RequestTiming(prompt_tokens=req.prompt_tokens)
    sent = time.perf_counter()
    last = sent
    chunks = 0
    abort_called: float | None = None
    clock = _AbortClock()
    abort_task: asyncio.Task[None] | None = None
    try:
        async with client.post("/v1/completions", json=body) as response:
            if response.status != 200:
                timing.error = f"{response.status}: {(await response.read())[:200]!r}"
                return timing
            async for raw in response.content:  # one line at a time
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:].strip()
                now = time.perf_counter()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                usage = event.get("usage")
                if usage:
                    timing.output_tokens = int(usage.get("completion_tokens", timing.output_tokens))
                # As `vllm bench serve` counts: every chunk with a choice is a token event, its text empty
                # or not (a detokenizer holding back a partial character sends one with no text).
                if not event.get("choices"):
                    continue
                chunks += 1
                if chunks == 1:
                    timing.ttft_s = now - sent
                    if req.abort is AbortWay.API:
                        abort_task = asyncio.create_task(_abort_later(client, event["id"], req.abort_after_s, clock))
                else:
                    timing.itl_s.append(now - last)
                last = now
                if req.abort is AbortWay.DISCONNECT and now - sent - timing.ttft_s >= req.abort_after_s:
                    abort_called = time.perf_counter()
                    closed_at = time.time()  # the server stamps its durable time with this clock
                    timing.aborted_by = AbortWay.DISCONNECT
                    timing.output_tokens = timing.output_tokens or chunks
                    response.close()
                    timing.rid, timing.closed_at = event["id"], closed_at
                    break
            abort_called = abort_called if abort_called is not None else clock.called
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        timing.error = f"{type(exc).__name__}: {exc}"
        return timing
    finally:
        if abort_task is not None and not abort_task.done():
            abort_task.cancel()
    end = time.perf_counter()
    timing.e2e_s = end - sent
    timing.output_tokens = timing.output_tokens or chunks
    if req.abort is AbortWay.API and abort_called is not None:
        timing.aborted_by = AbortWay.API
        timing.abort_latency_s = end - abort_called
    timing.ok = True
    return timing


@dataclass(slots=True)
class _AbortClock:
    called: float | None = None


async def _abort_later(client: aiohttp.ClientSession, rid: str, delay_s: float, clock: _AbortClock) -> None:
    await asyncio.sleep(delay_s)
    clock.called = time.perf_counter()
    async with client.post("/abort_request", json={"rid": rid}) as answer:
        await answer.read()


async def _durable_abort_latency(client: aiohttp.ClientSession, rid: str, closed_at: float,
                                 timeout_s: float = 10) -> float | None:
    """A disconnect has no answer to wait for: the abort is done once its finish is durable. The
    server says when (`abort_durable_time` in tokenledger's GET /requests/{rid}, wall clock), so the
    latency does not depend on when it is asked; a server without that route or field gives none."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with client.get(f"/requests/{rid}") as r:
            text = await r.text()
            if r.status == 404 and "error" not in text:
                return None  # not a tokenledger server
            view = json.loads(text) if r.status == 200 else {}
        if (durable := view.get("abort_durable_time")) is not None:
            return float(durable) - closed_at
        if (view.get("finish_reason") or {}).get("type") == "abort":
            # The log can show the FINISH a moment before the front hears it is durable; a server that
            # still gives no time a moment later is an older one.
            deadline = min(deadline, time.monotonic() + NO_DURABLE_TIME_S)
        await asyncio.sleep(ABORT_POLL_S)
    return None
