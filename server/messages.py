"""Typed messages between the HTTP front and the scheduler process, carried as msgpack.

Each message is a dataclass; on the wire it is `[tag, {field: value}]`. Nested deltas
and answers are dataclasses too and are rebuilt on decode.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgpack

from server.outputs import AbortAnswer, AbortStatus, RequestDelta
from server.request import LogprobRequest, RequestSpec
from server.sampling.params import SamplingParams


@dataclass(slots=True)
class GenerateMsg:
    rid: str
    prompt_ids: list[int]
    sampling: dict[str, Any]
    logprob: dict[str, Any]

    @classmethod
    def from_spec(cls, spec: RequestSpec) -> GenerateMsg:
        return cls(spec.rid, spec.prompt_ids, spec.params.to_dict(), dataclasses.asdict(spec.logprob))

    def to_spec(self) -> RequestSpec:
        params = SamplingParams.from_wire(self.sampling)
        return RequestSpec(self.rid, self.prompt_ids, params, LogprobRequest(**self.logprob))


@dataclass(slots=True)
class AbortMsg:
    ticket: int  # correlates the reply
    rids: list[str]  # empty with abort_all
    source: str
    abort_all: bool = False


@dataclass(slots=True)
class FlushCacheMsg:
    """Admin: drop every cached (not live) KV entry; refused while requests are live."""

    ticket: int


@dataclass(slots=True)
class FlushCacheReplyMsg:
    ticket: int
    flushed: bool
    live_requests: int  # why it was refused, when it was


@dataclass(slots=True)
class ShutdownMsg:
    grace_s: float


@dataclass(slots=True)
class ReadyMsg:
    model_dir: str
    log_dir: str
    vocab_size: int
    context_len: int
    kv_capacity: int
    instance_id: str


@dataclass(slots=True)
class DeltasMsg:
    deltas: list[RequestDelta]
    # Wall clock (time.time()) when their log group became durable: an abort's latency, measured
    # against a client's clock on the same machine, needs no polling (`GET /requests/{rid}`).
    durable_time: float = 0.0


@dataclass(slots=True)
class RejectMsg:
    """A request the scheduler refused after the front sent it (e.g. a rid race)."""

    rid: str
    message: str
    status: int


@dataclass(slots=True)
class AbortReplyMsg:
    ticket: int
    answers: list[AbortAnswer]


@dataclass(slots=True)
class StatsMsg:
    running: int
    waiting: int
    kv_used: int  # held by live requests
    kv_total: int
    durable_lsn: int
    kv_cached: int = 0  # held by the prefix cache
    prefix_query_tokens: int = 0  # running totals: prompt tokens admitted, and those the cache served
    prefix_hit_tokens: int = 0
    step_seconds: list[float] = field(default_factory=list)
    wal_commit_seconds: list[float] = field(default_factory=list)
    aborts: dict[str, int] = field(default_factory=dict)
    discarded: int = 0
    generated: int = 0


@dataclass(slots=True)
class FatalMsg:
    message: str


@dataclass(slots=True)
class StoppedMsg:
    pass


Message = (GenerateMsg | AbortMsg | ShutdownMsg | ReadyMsg | DeltasMsg | RejectMsg | AbortReplyMsg | StatsMsg
           | FatalMsg | StoppedMsg | FlushCacheMsg | FlushCacheReplyMsg)
# Tags are list positions: new types go at the end, so both processes of one build agree.
_TYPES: list[type] = [GenerateMsg, AbortMsg, ShutdownMsg, ReadyMsg, DeltasMsg, RejectMsg, AbortReplyMsg, StatsMsg,
                      FatalMsg, StoppedMsg, FlushCacheMsg, FlushCacheReplyMsg]
_TAGS = {cls: i for i, cls in enumerate(_TYPES)}


# A step's deltas go out as rows of their fields in this order: `dataclasses.asdict` deep-copies
# every token list and logprob, and cost the scheduler process ~5% of its time under load.
_DELTA_FIELDS = tuple(f.name for f in dataclasses.fields(RequestDelta))


def encode(msg: Message) -> bytes:
    fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    if isinstance(msg, DeltasMsg):
        fields["deltas"] = [[getattr(d, name) for name in _DELTA_FIELDS] for d in msg.deltas]
    elif isinstance(msg, AbortReplyMsg):
        fields["answers"] = [dataclasses.asdict(a) | {"status": a.status.value} for a in msg.answers]
    return msgpack.packb([_TAGS[type(msg)], fields], use_bin_type=True)


def decode(data: bytes) -> Message:
    tag, fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
    cls = _TYPES[tag]
    if cls is DeltasMsg:
        return DeltasMsg([RequestDelta(*row) for row in fields["deltas"]], fields["durable_time"])
    if cls is AbortReplyMsg:
        answers = [AbortAnswer(**(a | {"status": AbortStatus(a["status"])})) for a in fields["answers"]]
        return AbortReplyMsg(fields["ticket"], answers)
    return cls(**fields)
