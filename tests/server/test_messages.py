"""The scheduler ↔ front wire: every field of a step's deltas survives the trip."""
from __future__ import annotations

import dataclasses

from server.messages import DeltasMsg, decode, encode
from server.outputs import RequestDelta


def test_a_deltas_message_round_trips_every_field_of_every_delta():
    full = RequestDelta(rid="r-1", token_ids=[5, 6], logprobs=[-0.5, -1.25], top_logprobs=[[(5, -0.5), (7, -2.0)]],
                        input_logprobs=[-3.0], hidden_states=[[0.25, -0.5]], finish={"type": "length", "length": 2},
                        completion_tokens=2, reasoning_tokens=1)
    bare = RequestDelta(rid="r-2")
    got = decode(encode(DeltasMsg([full, bare], durable_time=1767225600.125)))
    assert isinstance(got, DeltasMsg) and got.durable_time == 1767225600.125
    # msgpack has one sequence type: the (id, logprob) pairs come back as lists.
    want = dataclasses.replace(full, top_logprobs=[[[5, -0.5], [7, -2.0]]])
    assert got.deltas == [want, bare]


def test_flush_cache_request_and_reply_round_trip_under_their_own_tags():
    from server.messages import FlushCacheMsg, FlushCacheReplyMsg

    assert decode(encode(FlushCacheMsg(ticket=7))) == FlushCacheMsg(7)
    assert decode(encode(FlushCacheReplyMsg(ticket=7, flushed=False, live_requests=3))) == FlushCacheReplyMsg(7, False, 3)
