"""Issue 11's abort p99: an abort that reaches the scheduler process while a forward runs is served
then. Its request's pending result is discarded (I2), its FINISH logged and flushed, and the
answer and the final chunk sent, all before that forward ends; not one forward later."""
from __future__ import annotations

import threading
import time

import zmq
from inproc_scheduler import generate_msg, inproc_scheduler

from commitlog import Kind, LogReader
from ops.logcli.checklog import check_log
from server.messages import AbortMsg, AbortReplyMsg, DeltasMsg, ShutdownMsg, encode
from server.outputs import AbortStatus

GREEDY = {"temperature": 0, "ignore_eos": True}
WAIT_S = 30.0


def _wait_for(condition, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def test_abort_arriving_mid_forward_is_finished_and_answered_before_that_forward_ends(tiny_checkpoint, tmp_path):
    """Also: its ABORT_REQUESTED, the DISCARD and the FINISH are one group (one fsync on the abort's
    path, not two in a row), and the answer goes out only after the final chunk."""
    log_dir = tmp_path / "log"
    with inproc_scheduler(tiny_checkpoint("llama"), log_dir, tmp_path) as proc:
        sent = proc.sender.sent  # type: ignore[attr-defined]
        push = proc.ctx.socket(zmq.PUSH)
        push.bind(f"ipc://{tmp_path}/in")
        launch = proc.sched.runner.launch
        held, release = threading.Event(), threading.Event()

        def launch_and_hold(batch):
            handle = launch(batch)  # on the CPU the forward has run; held here, the loop is still inside it
            victim = proc.sched.reqs.get("victim")
            if victim is not None and victim in batch.reqs and len(victim.output_ids) >= 3 and not held.is_set():
                held.set()
                release.wait(WAIT_S)
            return handle

        proc.sched.runner.launch = launch_and_hold  # type: ignore[method-assign]
        flush = proc.sched.flush
        groups_while_held: list[int] = []

        def counted_flush(*args, **kwargs):
            lsn = flush(*args, **kwargs)
            if held.is_set() and not release.is_set() and lsn is not None:
                groups_while_held.append(lsn)  # only the receiver flushes while the loop is held
            return lsn

        proc.sched.flush = counted_flush  # type: ignore[method-assign]
        loop = threading.Thread(target=proc.serve)
        loop.start()
        try:
            push.send(encode(generate_msg("victim", GREEDY | {"max_new_tokens": 64})))
            push.send(encode(generate_msg("bystander", GREEDY | {"max_new_tokens": 12}, prompt=[8, 9, 10, 11])))
            assert held.wait(WAIT_S), "the victim never reached a held forward"
            push.send(encode(AbortMsg(ticket=7, rids=["victim"], source="api")))

            def answered() -> list[AbortReplyMsg]:
                return [m for m in list(sent) if isinstance(m, AbortReplyMsg) and m.ticket == 7]

            def final_chunk() -> list:
                return [d for m in list(sent) if isinstance(m, DeltasMsg) for d in m.deltas
                        if d.rid == "victim" and d.finish is not None]

            served_mid_forward = _wait_for(lambda: bool(answered() and final_chunk()), timeout=10.0)
            still_held = not release.is_set()
        finally:
            release.set()
            push.send(encode(ShutdownMsg(grace_s=60)))  # the bystander drains, then the loop stops
            loop.join(WAIT_S)
            push.close(linger=0)
        assert not loop.is_alive()
        assert served_mid_forward and still_held, "the abort waited for the forward in progress"
        [answer] = answered()[0].answers
        assert answer.status is AbortStatus.ABORTED
        assert final_chunk()[0].finish["type"] == "abort"
        assert len(groups_while_held) == 1, f"the abort took {len(groups_while_held)} groups"
        order = [i for i, m in enumerate(sent) if isinstance(m, DeltasMsg) and any(
            d.rid == "victim" and d.finish is not None for d in m.deltas)] + [sent.index(answered()[0])]
        assert order == sorted(order), "the answer went out before the FINISH was durable and sent"
        shown = [t for m in sent if isinstance(m, DeltasMsg) for d in m.deltas if d.rid == "victim" for t in d.token_ids]

    reader = LogReader.open(log_dir)
    try:
        kinds = [r.kind for r in reader.request_records("victim")]
        committed = [t for r in reader.request_records("victim") if r.kind is Kind.COMMIT for t in r.payload["ids"]]
        bystander = reader.request_records("bystander")
        reader.verify()
    finally:
        reader.close()
    # The result pending when the abort came was discarded, then the request finished; the held
    # forward's segment was skipped, unlogged (FORMAT.md), so nothing follows the FINISH.
    assert kinds[-3:] == [Kind.ABORT_REQUESTED, Kind.DISCARD, Kind.FINISH]
    assert kinds.count(Kind.FINISH) == 1
    assert shown == committed and answer.completion_tokens == len(committed) >= 2
    assert sum(len(r.payload["ids"]) for r in bystander if r.kind is Kind.COMMIT) == 12
    report = check_log(str(log_dir), jobs=1)  # the schedule's linkage and every invariant, as `verify` checks
    assert report.failure is None and report.violations == []


def test_a_message_the_receiver_cannot_decode_stops_the_loop_loudly(tiny_checkpoint, tmp_path):
    """The receiver thread reads every message; a failure there must end `serve` with an error (the
    process then reports it to the front), never leave a loop running that nobody feeds."""
    with inproc_scheduler(tiny_checkpoint("llama"), tmp_path / "log", tmp_path) as proc:
        push = proc.ctx.socket(zmq.PUSH)
        push.bind(f"ipc://{tmp_path}/in")
        failures: list[BaseException] = []

        def serve() -> None:
            try:
                proc.serve()
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                failures.append(exc)

        loop = threading.Thread(target=serve)
        loop.start()
        try:
            push.send(b"\xc1 not a message")
            loop.join(WAIT_S)
        finally:
            push.close(linger=0)
        assert not loop.is_alive(), "the loop went on without its receiver"
        assert failures and "handling a message failed" in str(failures[0])
