"""`tokenledger serve`: the front process. Starts the scheduler process, serves HTTP, and
drains on SIGTERM: stop admitting (503), let running requests finish within the grace
period, abort the rest (logged), write SERVER_STOP, exit 0. Exits 1 if the scheduler dies."""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import FrameType

import structlog
import uvicorn
from fastapi import FastAPI

from server.config import ServerArgs, default_log_dir
from server.errors import EngineStoppedError
from server.heap import freeze_startup_heap
from server.http.app import create_app
from server.http.client import SchedulerClient
from server.http.front import Front
from server.log_setup import configure_logging
from server.models.config import ModelConfig
from server.models.demo import model_dir_for
from server.tokenizer import Tokenizer

log = structlog.get_logger("tokenledger.serve")


class FrontServer(uvicorn.Server):
    """SIGTERM/SIGINT start a drain instead of an immediate stop."""

    def __init__(self, config: uvicorn.Config, front: Front) -> None:
        super().__init__(config)
        self.front = front
        self.exit_code = 0
        self.drain_requested = asyncio.Event()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_requested.is_set():
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self.front.draining = True
        self.drain_requested.set()


def run_server(args: ServerArgs) -> int:
    configure_logging(args.log_format)
    model_dir = model_dir_for(args.model_path)
    ModelConfig.from_dir(model_dir)  # refuse a bad directory before starting anything
    args = args.with_changes(model_path=str(model_dir))
    log_dir = Path(args.log_dir) if args.log_dir else default_log_dir()
    client = SchedulerClient(args, log_dir)
    client.spawn()  # the scheduler loads the model while the front loads its tokenizer
    tokenizer = Tokenizer(Path(args.tokenizer_path or model_dir))
    # The chat tokenizer (transformers) and the constraint checks (xgrammar, which imports
    # transformers too) are loaded off the event loop's path, one after the other in ONE
    # thread: two threads importing the same packages at once raced into ImportErrors.
    # Readiness waits for it: a server that answers /health while it still imports would stall the
    # first requests behind those imports (seconds of CPU on the front's core).
    preloaded = threading.Event()
    threading.Thread(target=_preload_startup_imports, args=(tokenizer, preloaded), name="tokenledger-preload",
                     daemon=True).start()
    front = Front(args, client, tokenizer, args.served_model_name or model_dir.name)
    app = create_app(front)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=5)
    server = FrontServer(config, front)
    app.router.lifespan_context = _lifespan(server, front, preloaded)
    server.run()
    return server.exit_code


def _preload_startup_imports(tokenizer: Tokenizer, done: threading.Event) -> None:
    try:
        tokenizer.hf_tokenizer()
        importlib.import_module("xgrammar")
    finally:  # a failed preload is met again, as a typed error, by the first request that needs it
        done.set()


def _lifespan(server: FrontServer, front: Front, preloaded: threading.Event):  # -> lifespan context factory
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            ready = await front.client.start()
        except EngineStoppedError as exc:
            print(f"tokenledger: error: {exc}", file=sys.stderr)
            server.exit_code = 2
            server.should_exit = True
            yield
            return
        await asyncio.to_thread(preloaded.wait)
        freeze_startup_heap()
        front.on_ready()
        log.info("server_ready", model=ready.model_dir, log_dir=ready.log_dir, instance=ready.instance_id,
                 host=front.args.host, port=front.args.port)
        watcher = asyncio.create_task(_watch(server, front))
        try:
            yield
        finally:
            watcher.cancel()
            await front.client.shutdown(0)

    return lifespan


async def _watch(server: FrontServer, front: Front) -> None:
    drain = asyncio.ensure_future(server.drain_requested.wait())
    died = asyncio.ensure_future(front.client.stopped.wait())
    await asyncio.wait({drain, died}, return_when=asyncio.FIRST_COMPLETED)
    if died.done() and not drain.done():
        log.error("scheduler_died", reason=front.client.failure)
        server.exit_code = 1
    else:
        log.info("draining", grace_s=front.args.shutdown_grace_s)
        await front.client.shutdown(front.args.shutdown_grace_s)
        if front.client.failure and not front.client.stopped.is_set():
            server.exit_code = 1
    server.should_exit = True
