"""Server-sent events, and several async iterators merged in arrival order (n > 1 choices,
a native batch streamed together)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

from server.http.json_wire import dumps

T = TypeVar("T")
SSE_DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


async def interleave(sources: list[AsyncGenerator[T, None]]) -> AsyncIterator[T]:
    """Items of several iterators in the order they arrive (ties in list order). Closing this
    generator cancels or closes every source, so each runs its own abort-on-disconnect."""
    if len(sources) == 1:  # one stream (most requests): no task and no wait per item
        try:
            async for item in sources[0]:
                yield item
        finally:
            await sources[0].aclose()
        return
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
