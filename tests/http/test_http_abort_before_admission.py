"""An abort that reaches the front after it accepted a request but before the scheduler has
seen its generate: the abort wins (200 "aborted", 0 tokens, FINISH abort in the log) instead of
answering 404 and letting the request run in full. Driven in-process against the real
scheduler process. The window is held open on purpose: the scheduler process is stopped
(SIGSTOP) while the front accepts and aborts, so it reads both messages only afterwards."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from commitlog import LogReader
from commitlog.audit import audit_request
from server.config import ServerArgs
from server.http.client import SchedulerClient
from server.http.front import Front
from server.outputs import AbortStatus
from server.request import LogprobRequest, RequestSpec
from server.response import CommittedView
from server.sampling.params import SamplingParams
from server.tokenizer import Tokenizer

MAX_NEW = 200
RESUME_AFTER_S = 0.3  # long enough for the front to have sent every message it is going to send


class _StaysConnected:
    """What `Front.collect` needs of a starlette Request: a client that never goes away."""

    async def is_disconnected(self) -> bool:
        return False


def _spec(rid: str) -> RequestSpec:
    params = SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True, temperature=0.0, seed=0)
    return RequestSpec(rid, list(range(5, 25)), params, LogprobRequest())


def _view(spec: RequestSpec) -> CommittedView:
    return CommittedView(spec.rid, spec.prompt_ids, spec.logprob, spec.params.skip_special_tokens)


def _with_front(model_dir: Path, log_dir: Path, body: Callable[[Front], Awaitable[None]]) -> None:
    async def run() -> None:
        args = ServerArgs(model_path=str(model_dir), max_total_tokens=4096, chunked_prefill_size=64,
                          log_dir=str(log_dir))
        client = SchedulerClient(args, log_dir)
        await client.start(timeout_s=180)
        front = Front(args, client, Tokenizer(model_dir), "tiny")
        try:
            await body(front)
        finally:
            await client.shutdown(grace_s=5)

    asyncio.run(run())


@contextlib.contextmanager
def _scheduler_paused(front: Front):
    """The scheduler reads nothing until RESUME_AFTER_S after the block began: whatever the
    front sends meanwhile reaches it as if the scheduler had been slow to admit."""
    pid = front.client.process.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    handle = asyncio.get_running_loop().call_later(RESUME_AFTER_S, os.kill, pid, signal.SIGCONT)
    try:
        yield
    finally:
        handle.cancel()
        os.kill(pid, signal.SIGCONT)


def _logged(log_dir: Path, rid: str) -> dict:
    reader = LogReader.open(log_dir)
    try:
        view = audit_request(reader, rid)
    finally:
        reader.close()
    assert view is not None, f"the log has no {rid}"
    return view


@pytest.fixture
def model_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint("llama")


def test_abort_after_collect_accepted_but_before_its_generate_was_read_wins_with_zero_tokens(model_dir, tmp_path):
    """The non-streaming path (/generate, /v1/completions): the route has started collecting
    (accepted), and an abort is handled before collect's request tasks have run."""
    log_dir = tmp_path / "log"
    answers: list = []

    async def body(front: Front) -> None:
        spec = _spec("early-abort-collect")
        with _scheduler_paused(front):
            work = asyncio.ensure_future(front.collect([spec], _StaysConnected()))  # type: ignore[arg-type]
            await asyncio.sleep(0)  # the route runs up to its first wait: the request is accepted
            answers.extend(await front.abort(spec.rid, "api"))  # answered once the scheduler resumes
        views = await asyncio.wait_for(work, 60)
        assert views is not None
        assert views[0].finish is not None and views[0].finish["type"] == "abort", views[0].finish
        assert views[0].output_ids == []

    _with_front(model_dir, log_dir, body)
    assert [(a.status, a.completion_tokens) for a in answers] == [(AbortStatus.ABORTED, 0)]
    logged = _logged(log_dir, "early-abort-collect")
    assert logged["status"] == "aborted" and logged["finish_reason"]["type"] == "abort"
    # I2: nothing committed. Usually the scheduler reads the generate and the abort together and removes
    # the request while it waits, with no forward. The pause does not guarantee that both are read in one
    # go after SIGCONT (one clean-clone run logged a discarded result here): then one prefill launched
    # first, and its result was discarded, which is I2 too.
    assert logged["completion_tokens"] == 0 and logged["num_commits"] == 0
    assert logged["discarded_results"] in (0, 1)


def test_abort_of_an_accepted_stream_before_its_body_is_read_wins_with_zero_tokens(model_dir, tmp_path):
    """The streaming path: the route accepts, returns its response, and the abort comes before
    the response body has been iterated (the scheduler has not admitted the request)."""
    log_dir = tmp_path / "log"
    answers: list = []

    async def body(front: Front) -> None:
        spec = _spec("early-abort-stream")
        with _scheduler_paused(front):
            submission = front.accept([spec])[0]
            answers.extend(await front.abort(spec.rid, "api"))
        view = _view(spec)
        deltas = [d async for d in front.stream(spec, view, submission)]
        assert deltas[-1].finish is not None and deltas[-1].finish["type"] == "abort"
        assert sum(len(d.token_ids) for d in deltas) == 0 and view.output_ids == []
        assert not front.client.is_live(spec.rid)

    _with_front(model_dir, log_dir, body)
    assert [(a.status, a.completion_tokens) for a in answers] == [(AbortStatus.ABORTED, 0)]
    logged = _logged(log_dir, "early-abort-stream")
    assert logged["status"] == "aborted" and logged["completion_tokens"] == 0 and logged["num_commits"] == 0
    assert logged["discarded_results"] in (0, 1)  # one prefill may launch first (see the test above)


def test_an_accepted_request_nobody_reads_is_aborted_when_its_response_is_released(model_dir, tmp_path):
    """Accepting sends the generate at once, so a response whose body never runs (the client
    left before it began) must not leave the request running to its limit."""
    log_dir = tmp_path / "log"

    async def body(front: Front) -> None:
        spec = _spec("never-read")
        submission = front.accept([spec])[0]
        front.release([submission])
        for _ in range(600):
            if submission.finished:
                break
            await asyncio.sleep(0.05)
        assert submission.finished and not front.client.is_live(spec.rid)

    _with_front(model_dir, log_dir, body)
    logged = _logged(log_dir, "never-read")
    assert logged["status"] == "aborted" and logged["abort_source"] == "disconnect"
    assert logged["completion_tokens"] < MAX_NEW
