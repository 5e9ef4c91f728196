"""The post-mortem commands on logs the real engine wrote: what they print is what the engine
returned (I6: output ids, logprobs, finish reasons), aborts and discards included."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from logcli_helpers import cli

from commitlog import LogReader
from commitlog.audit import audit_request

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # the scripted runtime
from scripted import ScriptedRuntime  # noqa: E402

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine_run(tiny_checkpoint: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    from server import Engine

    model = tiny_checkpoint("llama")
    log = tmp_path_factory.mktemp("engine") / "log"
    engine = Engine(model_path=str(model), log_dir=str(log), max_total_tokens=4096, chunked_prefill_size=16,
                    log_durability="none")
    try:
        probe = engine.generate(input_ids=[5, 6, 7, 8, 9], sampling_params={"max_new_tokens": 6, **GREEDY}, rid="probe")
        stop_token = probe["output_ids"][2]
        results = engine.generate(
            input_ids=[[5, 6, 7, 8, 9], list(range(20, 60)), [3] * 7],
            sampling_params=[{"max_new_tokens": 8, "stop_token_ids": [stop_token], **GREEDY},
                             {"max_new_tokens": 8, **GREEDY}, {"max_new_tokens": 5, "temperature": 0.8, **{"ignore_eos": True}}],
            return_logprob=True, top_logprobs_num=2, rid=["stops", "lengths", "sampled"])
        got: dict[str, Any] = {"probe": probe, **{r["meta_info"]["id"]: r for r in results}}
        holder: list[Any] = []
        worker = threading.Thread(target=lambda: holder.append(engine.generate(
            input_ids=list(range(100, 130)), sampling_params={"max_new_tokens": 1500, **GREEDY},
            return_logprob=True, rid="victim")))
        worker.start()
        time.sleep(0.5)
        got["victim_abort"] = engine.abort("victim")
        worker.join(60)
        got["victim"] = holder[0]
    finally:
        engine.shutdown()
    return model, log, got


def _audits(log: Path) -> dict[str, dict[str, Any]]:
    ran = cli("audit", "--log-dir", log, "--json")
    assert ran.rc == 0, ran.err
    return {a["rid"]: a for a in ran.json_lines()}


def test_i6_audit_equals_what_the_engine_returned(engine_run: tuple[Path, Path, dict[str, Any]]) -> None:
    _, log, got = engine_run
    audits = _audits(log)
    assert set(audits) == {"probe", "stops", "lengths", "sampled", "victim"}
    assert got["stops"]["meta_info"]["finish_reason"]["type"] == "stop"
    assert got["lengths"]["meta_info"]["finish_reason"]["type"] == "length"
    assert got["victim"]["meta_info"]["finish_reason"]["type"] == "abort"
    for rid, result in got.items():
        if rid == "victim_abort":
            continue
        audit, meta = audits[rid], result["meta_info"]
        assert audit["output_ids"] == result["output_ids"], rid
        assert audit["finish_reason"] == meta["finish_reason"], rid
        assert (audit["prompt_tokens"], audit["completion_tokens"]) == (meta["prompt_tokens"], meta["completion_tokens"])
        if "output_token_logprobs" in meta:
            assert audit["output_logprobs"] == [lp for lp, _, _ in meta["output_token_logprobs"]], rid
        assert audit["status"] == {"stop": "finished", "length": "finished", "abort": "aborted"}[meta["finish_reason"]["type"]]
    victim = audits["victim"]
    assert victim["abort_source"] == "api" and victim["abort_lsn"] == got["victim_abort"]["lsn"]
    assert victim["completion_tokens"] == got["victim_abort"]["completion_tokens"]


def test_audit_request_is_the_same_object_as_the_cli_line(engine_run: tuple[Path, Path, dict[str, Any]]) -> None:
    _, log, _ = engine_run
    audits = _audits(log)
    reader = LogReader.open(log)
    try:
        for rid, line in audits.items():
            assert audit_request(reader, rid) == line
        assert audit_request(reader, "no-such-request") is None
    finally:
        reader.close()
    one = cli("audit", "--log-dir", log, "--rid", "stops", "--json").json_lines()
    assert one == [audits["stops"]]
    aborted = cli("audit", "--log-dir", log, "--status", "aborted", "--json").json_lines()
    assert [a["rid"] for a in aborted] == ["victim"]
    assert cli("audit", "--log-dir", log, "--since", "1d", "--json").json_lines() == list(audits.values())
    assert cli("audit", "--log-dir", log, "--since", "2999-01-01T00:00:00Z", "--json").out == ""


def test_verify_passes_on_the_engine_log(engine_run: tuple[Path, Path, dict[str, Any]]) -> None:
    _, log, _ = engine_run
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc == 0, ran.out
    body = ran.json()
    assert body["requests"]["begun"] == 5 and body["violations"] == []


def test_export_and_replay_decode_the_text_the_engine_returned(engine_run: tuple[Path, Path, dict[str, Any]],
                                                               tmp_path: Path) -> None:
    model, log, got = engine_run
    out = tmp_path / "export.jsonl"
    assert cli("export", "--log-dir", log, "--format", "jsonl", "--out", out, "--tokenizer", model).rc == 0
    import json

    lines = {d["rid"]: d for d in map(json.loads, out.read_text().splitlines())}
    for rid in ("stops", "lengths", "sampled", "victim"):
        assert lines[rid]["text"] == got[rid]["text"], rid
        assert lines[rid]["output_ids"] == got[rid]["output_ids"]
    tops = got["lengths"]["meta_info"]["output_top_logprobs"]
    assert lines["lengths"]["output_top_logprobs"] == [[[t, lp] for lp, t, _ in top] for top in tops]
    table = cli("replay", "--log-dir", log)
    assert table.rc == 0 and all(rid in table.out for rid in lines)
    timeline = cli("replay", "--log-dir", log, "--rid", "stops", "--tokenizer", model)
    assert timeline.rc == 0 and "BEGIN" in timeline.out and "FINISH" in timeline.out
    assert "KV released" in timeline.out and repr(got["stops"]["text"]) in timeline.out


def test_replay_and_export_decode_text_with_the_tokenizer_the_server_recorded(
        engine_run: tuple[Path, Path, dict[str, Any]], tmp_path: Path) -> None:
    _, log, got = engine_run  # no --tokenizer: the log names the model's tokenizer directory
    timeline = cli("replay", "--log-dir", log, "--rid", "stops")
    assert timeline.rc == 0 and repr(got["stops"]["text"]) in timeline.out
    out = tmp_path / "export.jsonl"
    assert cli("export", "--log-dir", log, "--format", "jsonl", "--out", out).rc == 0
    import json

    lines = {d["rid"]: d for d in map(json.loads, out.read_text().splitlines())}
    assert lines["stops"]["text"] == got["stops"]["text"]


def test_replay_until_lsn_shows_the_state_at_that_point(engine_run: tuple[Path, Path, dict[str, Any]]) -> None:
    _, log, got = engine_run
    reader = LogReader.open(log)
    records = reader.request_records("lengths")
    reader.close()
    second_commit = [r for r in records if r.kind.name == "COMMIT" and r.payload["ids"]][1]  # chunks commit no ids
    ran = cli("replay", "--log-dir", log, "--rid", "lengths", "--until-lsn", second_commit.lsn)
    assert ran.rc == 0 and "status running" in ran.out and "FINISH" not in ran.out
    assert f"output_ids {got['lengths']['output_ids'][:2]}" in ran.out


def test_discarded_final_extend_after_abort_is_audited(tiny_checkpoint: Any, tmp_path: Path) -> None:
    rt = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log", chunked_prefill_size=16)
    rt.submit(list(range(1, 6)), "other", max_new_tokens=6)
    rt.step()
    req = rt.submit(list(range(200, 240)), "victim", max_new_tokens=8)
    while req.scheduled_prefill_len < req.prompt_len:
        rt.sched.launch_next()
        while len(rt.sched.inflight) > 1:
            rt.sched.process_oldest()
        rt.sched.flush()
    answer = rt.abort("victim")
    rt.drain()
    client = rt.client
    rt.close()
    audits = _audits(tmp_path / "log")
    victim = audits["victim"]
    assert victim["discarded_results"] == 1 and victim["discard_reasons"][0].startswith("doomed")
    assert victim["output_ids"] == client.tokens["victim"] == [] and victim["abort_lsn"] == answer.lsn
    assert victim["finish_reason"] == client.finish["victim"] and victim["status"] == "aborted"
    assert audits["other"]["output_ids"] == client.tokens["other"]
    timeline = cli("replay", "--log-dir", tmp_path / "log", "--rid", "victim")
    assert "abort received from api" in timeline.out and "result discarded: doomed" in timeline.out
    assert cli("verify", "--log-dir", tmp_path / "log").rc == 0
