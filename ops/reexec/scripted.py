"""The real scheduler and model runner, with the batch choice taken from the log.

`ScriptedScheduler` overrides only `next_batch`: the members and segments come from a FORWARD
record, checked against the request's own progress, and the batch is built by the real
`BatchBuilder`. Launching, result processing, aborts, finishing and KV release are the
scheduler's own. `CheckingRunner` lets a hook see (and correct) each forward's packed result
before its tokens are published to the future map.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from commitlog.schedule import Segment
from server.forward_batch import BatchResult, ForwardBatch, ForwardMode
from server.model_runner import ModelRunner, PendingResult
from server.request import Req
from server.scheduler import Scheduler

ResultHook = Callable[[ForwardBatch, BatchResult], None]


class ScheduleMismatchError(Exception):
    """The logged segment is not what this request's progress allows: the log and this software disagree."""

    def __init__(self, rid: str, message: str) -> None:
        super().__init__(message)
        self.rid = rid


@dataclass(frozen=True, slots=True)
class Script:
    mode: str | None  # checked against the built batch; None when a forward was split (--isolated)
    members: list[tuple[Req, Segment]]


@dataclass(slots=True)
class CheckedResult:
    """A forward's result after the hook: what `ForwardHandle.result()` reads, and the (corrected)
    sampled tokens the runner publishes to the future map."""

    result: BatchResult
    token_ids: torch.Tensor

    def to_host(self) -> BatchResult:
        return self.result


class CheckingRunner(ModelRunner):
    hook: ResultHook | None = None

    def _forward(self, batch: ForwardBatch, input_ids: torch.Tensor) -> PendingResult:
        pending = super()._forward(batch, input_ids)
        if self.hook is None:
            return pending
        result = pending.to_host()  # re-execution reads every value anyway: no overlap to keep
        self.hook(batch, result)  # before `launch` publishes the sampled tokens
        token_ids = torch.tensor(result.next_token_ids, dtype=torch.int64, device=pending.token_ids.device)
        return CheckedResult(result, token_ids)  # type: ignore[return-value]  # the same two members


class ScriptedScheduler(Scheduler):
    script: Script | None = None

    def next_batch(self) -> ForwardBatch | None:
        script, self.script = self.script, None
        assert script is not None, "a scripted launch needs its script"
        extend: list[tuple[Req, int]] = []
        decode: list[Req] = []
        for req, seg in script.members:
            if seg.prefix < req.prompt_len:
                self._check_extend(req, seg)
                extend.append((req, seg.length))
            else:
                self._check_decode(req, seg)
                decode.append(req)
        batch = (self.builder.mixed(extend, decode) if extend and decode else
                 self.builder.extend(extend) if extend else self.builder.decode(decode))
        if script.mode is not None and batch.mode is not ForwardMode(script.mode):
            raise ScheduleMismatchError(script.members[0][0].rid, f"logged a {script.mode} forward; its members "
                                                                  f"make a {batch.mode.value} one")
        for req, n in extend:
            req.scheduled_prefill_len += n
            if req.scheduled_prefill_len == req.prompt_len:
                self.running.append(req)
        return batch

    def _check_extend(self, req: Req, seg: Segment) -> None:
        if req.pool_row is None:
            # Its first chunk: admitted here as the server admitted it, prefix-cache match included
            # (the tree is rebuilt by the same commits and finishes, in the logged order).
            self._admit(req)
        if seg.prefix != req.scheduled_prefill_len or seg.length < 1 or seg.prefix + seg.length > req.prompt_len:
            raise ScheduleMismatchError(req.rid, f"logged extend [{seg.prefix}, +{seg.length}) but "
                                                 f"{req.scheduled_prefill_len} of {req.prompt_len} prompt tokens were "
                                                 f"scheduled ({req.cached_len} from the prefix cache here)")

    def _check_decode(self, req: Req, seg: Segment) -> None:
        position = req.prompt_len + req.scheduled_tokens - 1
        if seg.length != 1 or seg.prefix != position or req.scheduled_prefill_len != req.prompt_len:
            raise ScheduleMismatchError(req.rid, f"logged decode at position {seg.prefix}; its next position is {position}")

    def _admit(self, req: Req) -> None:
        """First chunk: the request leaves the queue and takes its pool row, as `_admit_for_extend` does."""
        if req.grammar_future is not None:
            req.grammar_future.result()  # the server waited for the compile too; only its timing differs
            self.admit_compiled_grammars()
        if req not in self.waiting:
            raise ScheduleMismatchError(req.rid, "logged its first chunk, but it is not waiting to be admitted")
        self.waiting.remove(req)
        if not self._reserve(req):
            raise ScheduleMismatchError(req.rid, "logged as admitted, but the KV pool or request pool is full here")
