"""Engine.shutdown() with live requests: each is aborted (logged), its KV comes back, the log closes sound (issue 10 B.9)."""
from __future__ import annotations

import threading
import time

from commitlog import FinishReason, Kind, LogReader

LONG = {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}


def test_engine_shutdown_aborts_live_requests_logged_and_frees_their_kv(tiny_checkpoint, tmp_path):
    from server import Engine

    engine = Engine(model_path=str(tiny_checkpoint("llama")), log_dir=str(tmp_path / "log"), max_total_tokens=2000,
                    context_length=512, max_running_requests=1)  # the second request waits in the queue
    results: dict[str, object] = {}

    def run(rid: str) -> None:
        try:
            results[rid] = engine.generate(input_ids=[5, 6, 7], sampling_params=LONG, rid=rid)
        except Exception as exc:  # noqa: BLE001 - the test asserts what came back
            results[rid] = exc

    threads = [threading.Thread(target=run, args=(rid,)) for rid in ("running", "queued")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    # Both must have reached the scheduler: a generate still on its way when the shutdown lands is
    # refused instead (EngineStoppedError), which is not what this test is about.
    while not (engine.scheduler.running and engine.scheduler.waiting) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.scheduler.running, "the first request never started"
    assert engine.scheduler.waiting, "the second request never reached the queue"
    pool = engine.scheduler.kv_pool
    engine.shutdown()
    for t in threads:
        t.join(30)
    assert engine.scheduler.kv_live_tokens == 0  # every slot back or in the prefix cache, unlocked (I4)
    engine.scheduler.check_integrity()
    assert pool.num_free + engine.scheduler.kv_cached_tokens == pool.capacity
    for rid in ("running", "queued"):
        out = results[rid]
        assert isinstance(out, dict), out
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert out["meta_info"]["completion_tokens"] < LONG["max_new_tokens"]
    reader = LogReader.open(tmp_path / "log")
    try:
        for rid in ("running", "queued"):
            records = reader.request_records(rid)
            kinds = [r.kind for r in records]
            assert kinds[0] is Kind.BEGIN and kinds[-1] is Kind.FINISH, kinds
            assert Kind.ABORT_REQUESTED in kinds
            assert reader.rebuild(rid).finish_reason is FinishReason.ABORT
        assert reader.live_request_ids() == []
        reader.verify()
    finally:
        reader.close()


def test_engine_keeps_its_startup_heap_from_the_collector_and_hands_it_back_at_shutdown(tiny_checkpoint, tmp_path):
    """While it runs, the start-up heap is frozen (no full collection scans it: a 275 ms pause under
    load); after shutdown nothing stays frozen, so a stopped engine's cycles can be collected."""
    import gc

    from server import Engine

    engine = Engine(model_path=str(tiny_checkpoint("llama")), log_dir=str(tmp_path / "log"), max_total_tokens=512)
    try:
        assert gc.get_freeze_count() > 10_000
    finally:
        engine.shutdown()
    assert gc.get_freeze_count() == 0
