"""Random begin/stage/commit/rollback/doom/finish sequences: the log always rebuilds the live state.

Checks I1 (a rolled-back result changes nothing), I6 (log = state) and I7 (at most one FINISH)
after every step, against the ledger's states and an independent model.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field

from commitlog_helpers import FAST, FakeMatcher
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from commitlog import DoomSource, FinishReason, Kind, Ledger, RequestState

logprobs = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)
token = st.integers(min_value=0, max_value=50_000)
result = st.lists(st.tuples(token, logprobs), min_size=1, max_size=3)


@dataclass
class Model:
    """What a request must look like, computed without the ledger's code."""

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    num_discards: int = 0
    finish: str | None = None
    doomed: bool = False


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="cl-sm-")
        self.ledger = Ledger.open(self.dir, FAST)
        self.states: dict[str, RequestState] = {}
        self.models: dict[str, Model] = {}
        self.matchers: dict[str, FakeMatcher] = {}
        self.num_begun = 0

    def teardown(self) -> None:
        self.ledger.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _live(self) -> list[str]:
        return sorted(r for r, m in self.models.items() if m.finish is None)

    @rule(prompt=st.lists(token, min_size=1, max_size=4))
    def begin(self, prompt: list[int]) -> None:
        rid = f"r{self.num_begun}"
        self.num_begun += 1
        self.states[rid] = self.ledger.begin(rid, prompt, {"temperature": 0.0, "max_new_tokens": 8})
        self.models[rid], self.matchers[rid] = Model(), FakeMatcher()

    @precondition(lambda self: self._live())
    @rule(data=st.data(), tokens=result, commit=st.booleans(), finish=st.booleans())
    def process_result(self, data: st.DataObject, tokens: list[tuple[int, float]], commit: bool, finish: bool) -> None:
        rid = data.draw(st.sampled_from(self._live()))
        model, matcher = self.models[rid], self.matchers[rid]
        accepted_before = list(matcher.accepted)
        txn = self.ledger.step().open(rid, matcher)
        for tid, lp in tokens:
            txn.append_token(tid, lp, [(tid, lp)])
            txn.accept_grammar(tid)
        txn.advance_watermark(self.states[rid].kv_committed_len + len(tokens))
        if finish:
            txn.set_finish(FinishReason.STOP, matched=tokens[-1][0])
        if commit and not model.doomed:
            txn.commit()
            model.output_ids += [t for t, _ in tokens]
            model.output_logprobs += [lp for _, lp in tokens]
            model.finish = "stop" if finish else None
        else:
            txn.commit() if commit else txn.rollback("rejected")
            model.num_discards += 1
            model.finish = "abort" if model.doomed else None
            assert matcher.accepted == accepted_before  # I1: grammar staging undone
        self.ledger.flush()

    @precondition(lambda self: self._live())
    @rule(data=st.data(), source=st.sampled_from(list(DoomSource)))
    def doom(self, data: st.DataObject, source: DoomSource) -> None:
        rid = data.draw(st.sampled_from(self._live()))
        assert self.ledger.doom(rid, f"abort via {source.value}", source)
        self.models[rid].doomed = True

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def finish_waiting(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._live()))
        reason = FinishReason.ABORT if self.models[rid].doomed else FinishReason.LENGTH
        self.ledger.finish(rid, reason)
        self.models[rid].finish = reason.value

    @invariant()
    def log_rebuilds_every_request(self) -> None:
        lsn = self.ledger.flush()
        if lsn is not None:
            self.ledger.writer.wait_durable(lsn, timeout=10)
        rebuilt, finishes = self.ledger.read(_rebuild_all)
        for rid, state in self.states.items():
            model = self.models[rid]
            assert rebuilt[rid] == state  # I6
            assert state.output_ids == model.output_ids and state.output_logprobs == model.output_logprobs
            assert len(state.discards) == model.num_discards
            assert (state.finish_reason.value if state.finish_reason else None) == model.finish
            assert finishes.get(rid, 0) == (model.finish is not None)  # I7
            assert state.num_grammar_tokens == len(self.matchers[rid].accepted)
        assert set(self.ledger.live) == set(self._live())


def _rebuild_all(reader) -> tuple[dict[str, RequestState], dict[str, int]]:
    finishes: dict[str, int] = {}
    for record in reader.records():
        if record.kind is Kind.FINISH:
            finishes[record.rid] = finishes.get(record.rid, 0) + 1
    reader.verify()
    return {rid: reader.rebuild(rid) for rid in reader.request_ids()}, finishes


LedgerMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_i1_i6_i7_log_rebuilds_live_state_after_every_step = LedgerMachine.TestCase
