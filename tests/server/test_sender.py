"""The scheduler process's outbound `Sender`: a message goes out on the caller's thread when nothing
is queued before it, and through the sender thread when the front is behind. Either way the front
gets every message once, in the order each thread sent them, and a caller never waits on a full socket."""
from __future__ import annotations

import threading

import zmq

from server.messages import RejectMsg, decode
from server.scheduler_process import Sender

MESSAGES_PER_THREAD = 2000
NAMES = ("loop", "writer", "receiver")


def _receive_all(pull: zmq.Socket, count: int) -> list[RejectMsg]:
    received = []
    for _ in range(count):
        assert pull.poll(10_000), f"only {len(received)} of {count} messages arrived"
        msg = decode(pull.recv())
        assert isinstance(msg, RejectMsg)
        received.append(msg)
    return received


def test_sender_delivers_every_message_in_order_while_the_front_is_behind_and_never_blocks_a_caller():
    ctx = zmq.Context()
    # Both ends hold a few messages only (a context's options apply to the sockets it makes), so a
    # front that does not read fills the pipe after about eight.
    ctx.setsockopt(zmq.SNDHWM, 4)
    ctx.setsockopt(zmq.RCVHWM, 4)
    pull = ctx.socket(zmq.PULL)
    pull.bind("inproc://front")
    sender = Sender(ctx, "inproc://front")
    try:
        def send_all(name: str, numbers: range) -> None:
            for i in numbers:
                sender.send(RejectMsg(name, str(i), 400))

        def run_callers(numbers: range) -> list[threading.Thread]:
            callers = [threading.Thread(target=send_all, args=(name, numbers), daemon=True) for name in NAMES]
            for caller in callers:
                caller.start()
            return callers

        half = MESSAGES_PER_THREAD // 2
        first = run_callers(range(half))
        for caller in first:
            caller.join(timeout=10)
        # Nothing has been read yet: had a caller waited for room in the socket, it would still be here.
        assert not any(caller.is_alive() for caller in first), "a caller blocked on the full socket"
        assert sender._queued > 0, "the socket never filled: the queued path went untested"

        # The second half is sent while the front reads: the pipe has room again while the thread still
        # holds a backlog, and a caller that sent past that backlog would overtake it.
        second = run_callers(range(half, MESSAGES_PER_THREAD))
        received = _receive_all(pull, len(NAMES) * MESSAGES_PER_THREAD)
        for caller in second:
            caller.join(timeout=10)
        for name in NAMES:
            assert [int(m.message) for m in received if m.rid == name] == list(range(MESSAGES_PER_THREAD))
        sender.send(RejectMsg("after", "drained", 400))  # the queue is empty again: sent at once
        assert _receive_all(pull, 1)[0].rid == "after"
    finally:
        sender.close(timeout=5)
        pull.close(linger=0)
        ctx.term()
