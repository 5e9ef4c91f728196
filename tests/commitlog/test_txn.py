"""Request transactions: all-or-nothing (I1), doom wins (I2), cursors advance on discard (I3)."""
from __future__ import annotations

import pytest
from commitlog_helpers import FakeMatcher, sync_flush

from commitlog import (
    BatchCursors,
    DoomSource,
    FinishReason,
    Kind,
    Ledger,
    Outcome,
    RequestState,
    RequestTxn,
    TxnStateError,
)
from commitlog.codec import Entry
from commitlog.state import Delta


def _state() -> RequestState:
    return RequestState("r", [1, 2, 3], {"temperature": 0.0})


def _stage_everything(txn: RequestTxn) -> None:
    txn.append_token(7, -0.5, [(7, -0.5), (9, -1.5)])
    txn.accept_grammar(7)
    txn.add_input_logprobs([-1.0, -2.0])
    txn.add_hidden_state(b"\x01\x02")
    txn.add_reasoning(1, is_ended=True)
    txn.advance_watermark(4)


def test_i1_commit_applies_every_staged_mutation_and_logs_one_commit() -> None:
    state, entries, matcher = _state(), [], FakeMatcher()
    txn = RequestTxn(state, entries, matcher)
    _stage_everything(txn)
    assert state.output_ids == []  # staged, not applied
    assert txn.commit() is Outcome.COMMITTED
    assert (state.output_ids, state.output_logprobs) == ([7], [-0.5])
    assert state.output_top_logprobs == [[(7, -0.5), (9, -1.5)]]
    assert (state.input_logprobs, state.hidden_states) == ([-1.0, -2.0], [b"\x01\x02"])
    assert (state.num_reasoning_tokens, state.is_reasoning_ended) == (1, True)
    assert (state.kv_committed_len, state.num_grammar_tokens, matcher.accepted) == (4, 1, [7])
    assert [e.kind for e in entries] == [Kind.COMMIT]
    assert Delta.from_payload(entries[0].payload).output_ids == [7]


def test_i1_rollback_applies_nothing_and_logs_one_discard() -> None:
    state, entries, matcher = _state(), [], FakeMatcher()
    before = RequestState("r", [1, 2, 3], {"temperature": 0.0})
    txn = RequestTxn(state, entries, matcher)
    _stage_everything(txn)
    assert txn.rollback("spec draft rejected") is Outcome.DISCARDED
    before.discards.append("spec draft rejected")
    assert state == before
    assert matcher.accepted == []  # grammar staging undone
    assert [(e.kind, e.payload) for e in entries] == [(Kind.DISCARD, {"reason": "spec draft rejected"})]


def test_i1_rollback_undoes_only_the_tokens_the_grammar_accepted() -> None:
    matcher = FakeMatcher(reject=frozenset({5}))
    matcher.accepted = [1, 2]  # committed earlier
    txn = RequestTxn(_state(), [], matcher)
    assert txn.accept_grammar(3) and not txn.accept_grammar(5)
    txn.rollback("x")
    assert matcher.accepted == [1, 2]


def test_i2_commit_of_a_doomed_request_rolls_back_and_finishes_abort() -> None:
    state, entries, matcher = _state(), [], FakeMatcher()
    txn = RequestTxn(state, entries, matcher)
    _stage_everything(txn)
    state.doom_reason, state.doom_source = "client abort", DoomSource.API
    assert txn.commit() is Outcome.DISCARDED
    assert state.output_ids == [] and state.kv_committed_len == 0 and matcher.accepted == []
    assert state.finish_reason is FinishReason.ABORT
    assert [e.kind for e in entries] == [Kind.DISCARD, Kind.FINISH]
    assert entries[1].payload["reason"] == "abort" and entries[1].payload["n_out"] == 0


def test_i2_abort_between_stage_and_commit_appends_nothing(ledger: Ledger) -> None:
    ledger.begin("r", [1, 2], {})
    sync_flush(ledger)
    step = ledger.step()
    txn = step.open("r")
    txn.append_token(11, -0.1)  # the delayed final-prefill result
    assert ledger.doom("r", "client went away", DoomSource.DISCONNECT)
    assert txn.commit() is Outcome.DISCARDED
    sync_flush(ledger)
    rebuilt = ledger.read(lambda r: r.rebuild("r"))
    assert rebuilt.output_ids == [] and rebuilt.finish_reason is FinishReason.ABORT
    assert rebuilt.doom_source is DoomSource.DISCONNECT
    kinds = ledger.read(lambda r: [rec.kind for rec in r.request_records("r")])
    assert kinds == [Kind.BEGIN, Kind.ABORT_REQUESTED, Kind.DISCARD, Kind.FINISH]
    assert "r" not in ledger.live


def test_i2_doom_answers_false_for_unknown_or_finished_requests(ledger: Ledger) -> None:
    assert not ledger.doom("nope", "x", DoomSource.API)
    ledger.begin("r", [1], {})
    ledger.finish("r", FinishReason.ABORT)
    sync_flush(ledger)
    assert not ledger.doom("r", "x", DoomSource.API)


def test_i2_doom_is_logged_once_and_keeps_the_first_reason(ledger: Ledger) -> None:
    ledger.begin("r", [1], {})
    assert ledger.doom("r", "first", DoomSource.API) and ledger.doom("r", "second", DoomSource.TIMEOUT)
    sync_flush(ledger)
    kinds = ledger.read(lambda r: [rec.kind for rec in r.request_records("r")])
    assert kinds.count(Kind.ABORT_REQUESTED) == 1
    assert ledger.get("r").doom_reason == "first"


def test_i3_discarded_segment_still_advances_packed_cursors() -> None:
    packed_logprobs = [0.1, 0.2, 0.3, 0.4, 0.5]
    cursors = BatchCursors.start()
    doomed, live = _state(), RequestState("b", [1], {})
    doomed.doom_reason = "abort"
    got = {}
    for state, n in ((doomed, 2), (live, 3)):
        lp, _, _ = cursors.take(n, 0)
        txn = RequestTxn(state, [])
        for value in packed_logprobs[lp]:
            txn.append_token(1, value)
        txn.commit()
        got[state.rid] = state.output_logprobs
    assert got == {"r": [], "b": [0.3, 0.4, 0.5]}
    assert cursors.logprobs.offset == 5


def test_finish_staged_in_a_commit_logs_commit_then_finish() -> None:
    state, entries = _state(), []
    txn = RequestTxn(state, entries)
    txn.append_token(2, -0.1)
    txn.set_finish(FinishReason.STOP, matched=2)
    txn.commit()
    assert [e.kind for e in entries] == [Kind.COMMIT, Kind.FINISH]
    assert entries[1].payload == {"reason": "stop", "matched": 2, "n_out": 1, "kv": 0}
    with pytest.raises(TxnStateError):
        RequestTxn(state, [])


def test_a_closed_transaction_refuses_more_staging() -> None:
    txn = RequestTxn(_state(), [])
    txn.commit()
    for call in (lambda: txn.append_token(1), txn.commit, lambda: txn.rollback("x")):
        with pytest.raises(TxnStateError):
            call()


def test_bad_arguments_raise_value_error(ledger: Ledger) -> None:
    txn = RequestTxn(_state(), [])
    txn.advance_watermark(3)
    txn.commit()
    with pytest.raises(ValueError):
        RequestTxn(txn.state, []).advance_watermark(2)
    with pytest.raises(ValueError):
        RequestTxn(txn.state, []).set_finish(FinishReason.ABORT)
    with pytest.raises(ValueError):
        ledger.begin("", [1], {})


def test_step_refuses_to_flush_with_an_open_transaction(ledger: Ledger) -> None:
    ledger.begin("r", [1], {})
    step = ledger.step()
    txn = step.open("r")
    with pytest.raises(TxnStateError, match="open transactions"):
        step.flush()
    txn.commit()
    assert step.flush() is not None


def test_entries_of_a_step_are_flushed_as_one_lmdb_write_txn(ledger: Ledger) -> None:
    for rid in "abc":
        ledger.begin(rid, [1], {})
    sync_flush(ledger)
    before = ledger.read(lambda r: r.wal.env.info()["last_txnid"])
    step = ledger.step()
    for rid in "abc":
        txn = step.open(rid)
        txn.append_token(5, -0.1)
        txn.commit() if rid != "b" else txn.rollback("x")
    ledger.writer.wait_durable(step.flush())
    after = ledger.read(lambda r: r.wal.env.info()["last_txnid"])
    assert after - before == 1


def test_entry_is_not_shared_between_requests() -> None:
    entries: list[Entry] = []
    a, b = _state(), RequestState("b", [1], {})
    for state in (a, b):
        txn = RequestTxn(state, entries)
        txn.append_token(4)
        txn.commit()
    assert [e.rid for e in entries] == ["r", "b"]


def test_staged_lsn_is_the_lsn_the_abort_record_gets(ledger: Ledger) -> None:
    ledger.begin("r", [1], {})
    sync_flush(ledger)
    assert ledger.staged_lsn() == ledger.writer.durable_lsn
    ledger.doom("r", "stop", DoomSource.API)
    promised = ledger.staged_lsn()
    sync_flush(ledger)
    record = ledger.read(lambda r: next(iter(r.records(promised, promised))))
    assert record.kind is Kind.ABORT_REQUESTED and record.rid == "r"
