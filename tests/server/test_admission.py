"""A request the scheduler cannot admit fails alone: the loop, the process and the log go on (issue 10 A.1)."""
from __future__ import annotations

import pytest
from inproc_scheduler import generate_msg, inproc_scheduler

from commitlog import Kind, LogReader
from commitlog.rids import MAX_RID_BYTES
from server.errors import InvalidRequestError
from server.messages import RejectMsg
from server.request import LogprobRequest, RequestSpec
from server.sampling.params import SamplingParams

LONG_RID = "r" * (MAX_RID_BYTES + 1)
SURROGATE_RID = "bad\ud800rid"
GREEDY = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("rid", [LONG_RID, SURROGATE_RID], ids=["over_256_bytes", "lone_surrogate"])
def test_scheduler_process_rejects_a_rid_it_cannot_log_and_keeps_serving(tiny_checkpoint, tmp_path, rid):
    with inproc_scheduler(tiny_checkpoint("llama"), tmp_path / "log", tmp_path) as proc:
        sent = proc.sender.sent  # type: ignore[attr-defined]
        proc._handle(generate_msg(rid, GREEDY))  # before the fix: ValueError out of Ledger.begin, the process exits
        rejects = [m for m in sent if isinstance(m, RejectMsg)]
        assert [(r.rid, r.status) for r in rejects] == [(rid, 400)]
        assert "rid" in rejects[0].message
        assert proc.sched.is_idle  # nothing held for the refused request
        proc._handle(generate_msg("after", GREEDY))
        while not proc.sched.is_idle:
            proc.sched.run_step()
        assert proc.sched.kv_live_tokens == 0
    reader = LogReader.open(tmp_path / "log")
    try:
        kinds = [r.kind for r in reader.request_records("after")]
        assert kinds[0] is Kind.BEGIN and kinds[-1] is Kind.FINISH
        reader.verify()  # raises on any broken record or chain link
    finally:
        reader.close()


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    from server import Engine

    e = Engine(model_path=str(tiny_checkpoint("llama")), max_total_tokens=1000, context_length=512)
    yield e
    e.shutdown()


@pytest.mark.parametrize("rid", [LONG_RID, SURROGATE_RID], ids=["over_256_bytes", "lone_surrogate"])
def test_engine_generate_refuses_a_bad_rid_naming_it_and_keeps_running(engine, rid):
    with pytest.raises(InvalidRequestError) as info:
        engine.generate(input_ids=[5, 6], sampling_params=GREEDY, rid=rid)
    assert info.value.param == "rid"
    assert engine.generate(input_ids=[5, 6], sampling_params=GREEDY)["meta_info"]["completion_tokens"] == 3


def test_engine_loop_survives_a_request_that_skipped_the_builder(engine):
    from server.request import Req

    spec = RequestSpec(LONG_RID, [5, 6], SamplingParams.from_dict(GREEDY | {"seed": 1}), LogprobRequest())
    (waiter,) = engine._submit([Req.from_spec(spec)])  # as a caller bypassing RequestBuilder would
    assert waiter.done.wait(30)
    assert isinstance(waiter.error, InvalidRequestError) and waiter.error.param == "rid"
    assert engine.generate(input_ids=[5, 6], sampling_params=GREEDY)["meta_info"]["completion_tokens"] == 3
