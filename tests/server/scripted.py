"""A scripted runtime: drives the real scheduler one piece at a time (launch, process,
flush, abort) so a test can stop inside any window. Production never imports this."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commitlog import DoomSource, Kind, Record, RequestState
from server.config import ServerArgs
from server.forward_batch import ForwardBatch
from server.model_runner import ForwardHandle
from server.outputs import AbortAnswer, RequestDelta
from server.request import Req
from server.request_builder import GenerateCall, RequestBuilder
from server.runtime import build_runtime


@dataclass
class ClientView:
    """What clients were shown: every durable delta, in order, per rid."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[float]] = field(default_factory=dict)
    finish: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def receive(self, deltas: list[RequestDelta], error: BaseException | None) -> None:
        assert error is None, error
        with self.lock:
            for d in deltas:
                assert d.rid not in self.finish, f"delta for {d.rid} after its finish"
                self.tokens.setdefault(d.rid, []).extend(d.token_ids)
                self.logprobs.setdefault(d.rid, []).extend(d.logprobs)
                if d.finish is not None:
                    self.finish[d.rid] = d.finish


class ScriptedRuntime:
    def __init__(self, model_dir: Path, log_dir: Path, **server_args: Any) -> None:
        server_args.setdefault("max_total_tokens", 2048)
        server_args.setdefault("log_durability", "none")
        server_args.setdefault("device", "cpu")  # CPU by default; the gpu tests ask for cuda
        self.args = ServerArgs.from_kwargs(model_path=str(model_dir), **server_args)
        self.client = ClientView()
        self.runtime = build_runtime(self.args, log_dir, self.client.receive)
        self.sched = self.runtime.scheduler
        self.builder = RequestBuilder(self.runtime.tokenizer, self.runtime.limits, 0)
        self.launched: list[ForwardBatch] = []
        original = self.sched.runner.launch

        def spy(batch: ForwardBatch) -> ForwardHandle:
            self.launched.append(batch)
            return original(batch)

        self.sched.runner.launch = spy  # type: ignore[method-assign]

    def submit(self, input_ids: list[int], rid: str, **params: Any) -> Req:
        logprob = {k: params.pop(k) for k in ("return_logprob", "top_logprobs_num", "return_hidden_states", "logprob_start_len") if k in params}
        params.setdefault("temperature", 0)
        (spec,), _ = self.builder.build(GenerateCall(input_ids=input_ids, sampling_params=params, rid=rid, **logprob))
        req = Req.from_spec(spec)
        self.sched.add_request(req)
        return req

    def abort(self, rid: str, source: DoomSource = DoomSource.API) -> AbortAnswer:
        got: list[AbortAnswer] = []
        done = threading.Event()
        self.sched.abort(rid, source, lambda answer, _err: (got.append(answer), done.set()))
        assert done.wait(10)
        return got[0]

    def step(self) -> None:
        self.sched.run_step()
        self.wait_durable()

    def drain(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if self.sched.is_idle:
                self.wait_durable()
                return
            self.step()
        raise AssertionError("scheduler did not drain")

    def wait_durable(self) -> None:
        ledger = self.sched.ledger
        assert ledger.writer.wait_durable(ledger.staged_lsn(), timeout=10)

    def batches_with(self, req: Req, after: int = 0) -> list[ForwardBatch]:
        return [b for b in self.launched[after:] if any(r is req for r in b.reqs)]

    def records(self, rid: str) -> list[Record]:
        return self.sched.ledger.read(lambda reader: reader.request_records(rid))

    def kinds(self, rid: str) -> list[Kind]:
        return [r.kind for r in self.records(rid)]

    def rebuilt(self, rid: str) -> RequestState:
        return self.sched.ledger.read(lambda reader: reader.rebuild(rid))

    def close(self) -> None:
        self.sched.ledger.close()
