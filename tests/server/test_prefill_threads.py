"""`--prefill-threads`: on CPU a forward that prefills (extend, mixed) runs on its own torch thread count and
a decode on `--num-threads`; `--small-decode-rows`: a decode of at most that many rows runs on one thread.
The count is restored after each forward, recorded in SERVER_START, and read back by re-execution (logs
from before a key ran those forwards on `num_threads`)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from commitlog.codec import Kind
from commitlog.reader import LogReader
from ops.reexec.runtime import server_args
from server.config import ServerArgs
from server.forward_batch import ForwardMode


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """The engine sets the process's thread count; later tests must not inherit one."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _threads_seen(engine: Any, key: Callable[[Any], Any]) -> dict[Any, set[int]]:
    """Wraps the runner's forward so each launch records the thread count it ran under, by `key(batch)`."""
    runner = engine.scheduler.runner
    seen: dict[Any, set[int]] = {}
    run = runner._run

    def recording(batch: Any) -> Any:
        seen.setdefault(key(batch), set()).add(torch.get_num_threads())
        return run(batch)

    runner._run = recording
    return seen


def _threads_per_mode(engine: Any) -> dict[ForwardMode, set[int]]:
    return _threads_seen(engine, lambda batch: batch.mode)


def test_extend_and_mixed_forwards_run_on_prefill_threads_and_decodes_on_num_threads(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"), num_threads=1, prefill_threads=2, chunked_prefill_size=16,
                         enable_mixed_chunk=True, torch_compile="off")
    seen = _threads_per_mode(engine)
    prompts = [[(3 * i + j) % 400 + 3 for j in range(4 + 13 * i)] for i in range(6)]
    engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert seen == {ForwardMode.EXTEND: {2}, ForwardMode.MIXED: {2}, ForwardMode.DECODE: {1}}
    assert torch.get_num_threads() == 1  # restored after every prefill


def test_without_the_flag_every_forward_runs_on_num_threads(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"), num_threads=1, torch_compile="off")
    seen = _threads_per_mode(engine)
    engine.generate(input_ids=[[5, 6, 7, 8]], sampling_params={"max_new_tokens": 4, "temperature": 0})
    assert seen == {ForwardMode.EXTEND: {1}, ForwardMode.DECODE: {1}}


def test_a_decode_of_at_most_small_decode_rows_runs_on_one_thread_and_a_larger_one_on_num_threads(tiny_checkpoint,
                                                                                                      make_engine):
    engine = make_engine(tiny_checkpoint("llama"), num_threads=2, small_decode_rows=3, torch_compile="off")
    seen = _threads_seen(engine, lambda batch: (batch.mode, len(batch.reqs)))
    # Six requests finishing one after another: decodes of 6 rows down to 1.
    params = [{"max_new_tokens": 3 + 2 * i, "temperature": 0, "ignore_eos": True} for i in range(6)]
    engine.generate(input_ids=[[5 + i, 6, 7, 8] for i in range(6)], sampling_params=params)
    decodes = {rows: threads for (mode, rows), threads in seen.items() if mode is ForwardMode.DECODE}
    assert sorted(decodes) == [1, 2, 3, 4, 5, 6]
    assert all(threads == ({1} if rows <= 3 else {2}) for rows, threads in decodes.items()), decodes
    assert all(threads == {2} for (mode, _), threads in seen.items() if mode is not ForwardMode.DECODE)
    assert torch.get_num_threads() == 2  # restored after every small decode


def test_small_decode_rows_is_off_by_default():
    assert ServerArgs().small_decode_rows == 0


def test_server_start_records_the_thread_counts_and_reexecution_reads_them(tmp_path: Path, tiny_checkpoint,
                                                                          make_engine):
    model = tiny_checkpoint("llama")
    make_engine(model, num_threads=1, prefill_threads=2, small_decode_rows=5, log_dir=str(tmp_path / "log"),
                torch_compile="off").shutdown()
    reader = LogReader.open(tmp_path / "log")
    try:
        engine = next(r for r in reader.records() if r.kind is Kind.SERVER_START).payload["engine"]
    finally:
        reader.close()
    assert (engine["num_threads"], engine["prefill_threads"], engine["small_decode_rows"]) == (1, 2, 5)
    rebuilt = server_args(engine, model, None)
    assert (rebuilt.num_threads, rebuilt.prefill_threads, rebuilt.small_decode_rows) == (1, 2, 5)
    older = {k: v for k, v in engine.items() if k not in ("prefill_threads", "small_decode_rows")}  # before the keys
    rebuilt_older = server_args(older, model, None)
    assert (rebuilt_older.prefill_threads, rebuilt_older.small_decode_rows) == (1, 0)
