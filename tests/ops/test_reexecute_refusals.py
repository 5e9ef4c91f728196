"""What `replay --reexecute` refuses, each with a message and an exit code, never a traceback:
a changed checkpoint (2, unless --model-path), a missing one (2), a damaged log (2), and requests
it cannot re-run (1, each saying why: a log from before the schedule)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from logcli_helpers import begin, cli, commit, finish, write_log, write_pristine_log
from test_cli_verify_schedule import START, STOP, fwd


@pytest.fixture(scope="module")
def copied_model_log(tiny_checkpoint: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A log served from a copy of the checkpoint, so the tests can change or remove the copy."""
    from server import Engine

    root = tmp_path_factory.mktemp("copied")
    model = root / "model"
    shutil.copytree(tiny_checkpoint("llama"), model)
    engine = Engine(model_path=str(model), log_dir=str(root / "log"), max_total_tokens=1024, log_durability="none")
    try:
        engine.generate(input_ids=[4, 5, 6], sampling_params={"max_new_tokens": 4, "temperature": 0}, rid="only")
    finally:
        engine.shutdown()
    return model, root / "log"


def _no_traceback(ran: Any) -> None:
    assert "Traceback" not in ran.out + ran.err


def test_changed_checkpoint_is_refused_unless_model_path_is_given(copied_model_log: tuple[Path, Path]) -> None:
    model, log = copied_model_log
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config, indent=3))  # same model, other bytes: other fingerprint
    ran = cli("replay", "--log-dir", log, "--reexecute")
    assert ran.rc == 2 and "fingerprint" in ran.err and "--model-path" in ran.err, ran.err
    _no_traceback(ran)
    assert cli("replay", "--log-dir", log, "--reexecute", "--model-path", model).rc == 0


def test_missing_checkpoint_is_exit_2(copied_model_log: tuple[Path, Path], tmp_path: Path) -> None:
    _, log = copied_model_log
    ran = cli("replay", "--log-dir", log, "--reexecute", "--model-path", tmp_path / "nothing-here")
    assert ran.rc == 2 and "no checkpoint at" in ran.err, ran.err
    _no_traceback(ran)


def test_log_from_before_the_schedule_is_not_reexecutable(tmp_path: Path) -> None:
    ran = cli("replay", "--log-dir", write_pristine_log(tmp_path / "log"), "--reexecute", "--json")
    assert ran.rc == 1, ran.err
    reasons = {r["reason"] for r in ran.json()["requests"]}
    assert reasons == {"logged by a server that did not record its schedule"}


def test_damaged_log_is_exit_2(tmp_path: Path) -> None:
    from logcli_helpers import record_values

    from commitlog.codec import lsn_key
    from commitlog.wal import Wal

    log = write_pristine_log(tmp_path / "log")
    value = bytearray(record_values(log)[5])
    value[-1] ^= 0xFF
    wal = Wal.open(log)
    with wal.env.begin(write=True) as txn:
        txn.put(lsn_key(5), bytes(value), db=wal.records)
    wal.close()
    ran = cli("replay", "--log-dir", log, "--reexecute")
    assert ran.rc == 2 and "LSN 5" in ran.err, ran.err
    _no_traceback(ran)


def test_forward_naming_a_request_that_is_not_running_is_a_damaged_log(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_log(log, [[START, begin("a"), fwd(1, ["ghost"], [0], [3])], [finish("a", "abort", 0, 0), STOP]])
    ran = cli("replay", "--log-dir", log, "--reexecute")
    assert ran.rc == 2 and "'ghost', which is not running" in ran.err, ran.err
    _no_traceback(ran)


def test_request_whose_server_start_was_dropped_is_listed_not_reexecutable(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_log(log, [[begin("kept")], [fwd(1, ["kept"], [0], [3]), commit("kept", [9], wm=3)],
                    [finish("kept", "length", 1, 3)]])
    ran = cli("replay", "--log-dir", log, "--reexecute", "--json")
    assert ran.rc == 1, ran.err
    (req,) = ran.json()["requests"]
    assert req["rid"] == "kept" and "SERVER_START is not in the log" in req["reason"]


def test_sampled_request_from_a_log_of_another_sampler_is_refused_and_a_greedy_one_runs() -> None:
    from ops.reexec.plan import LoggedRequest
    from ops.reexec.requests import NotReexecutableError, request_from_log
    from server.sampling.sampler import INVERSE_CDF, LEGACY_SAMPLER

    sampled = LoggedRequest("s", 1, 1, [4, 5], {"max_new_tokens": 3, "temperature": 0.8, "seed": 9}, None)
    greedy = LoggedRequest("g", 2, 1, [4, 5], {"max_new_tokens": 3, "temperature": 0.0, "seed": 9}, None)
    with pytest.raises(NotReexecutableError, match="exponential-race"):
        request_from_log(sampled, LEGACY_SAMPLER)
    assert request_from_log(greedy, LEGACY_SAMPLER).params.is_greedy
    assert request_from_log(sampled, INVERSE_CDF).rng.random() == request_from_log(sampled, INVERSE_CDF).rng.random()


def test_server_start_records_the_sampler(copied_model_log: tuple[Path, Path]) -> None:
    from commitlog import Kind
    from commitlog.reader import LogReader

    reader = LogReader.open(copied_model_log[1])
    try:
        start = next(r for r in reader.records() if r.kind is Kind.SERVER_START)
    finally:
        reader.close()
    assert start.payload["engine"]["sampler"] == "inverse-cdf"
