"""`replay --reexecute` on logs the real engine wrote: the logged schedule re-run with the serving
checkpoint proves every request (exit 0); other weights of the same shape, or an edited COMMIT
whose hash chain was recomputed, are caught (exit 1) by request and output position."""
from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from logcli_helpers import cli
from reexec_helpers import ServedLog, entries, kinds, rewrite_rechained, serve_log

from commitlog import Kind
from server.models.demo import CheckpointSpec, build_checkpoint


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Any, tmp_path_factory: pytest.TempPathFactory) -> ServedLog:
    return serve_log(tiny_checkpoint("llama"), tmp_path_factory.mktemp("served") / "log")


@pytest.fixture(scope="module")
def reexecuted(served: ServedLog) -> dict[str, Any]:
    ran = cli("replay", "--log-dir", served.log, "--reexecute", "--json")
    assert ran.rc == 0, ran.out + ran.err
    return {r["rid"]: r for r in ran.json()["requests"]}


def test_the_served_log_has_what_the_proof_must_cover(served: ServedLog) -> None:
    records = kinds(served.log)
    forwards = [p for k, _, p in records if k is Kind.FORWARD]
    assert any(p["q"] == 1 for p in forwards), "overlap: a launch with a result still pending"
    assert any(0 < pre < 40 and p["mode"] != "decode" for p in forwards for pre in p["pre"]), "a chunked prefill"
    assert max(len(p["rids"]) for p in forwards) >= 8, "concurrent requests share forwards"
    assert sum(k is Kind.ABORT_REQUESTED for k, _, _ in records) >= 2
    first = next(p for k, _, p in records if k is Kind.FORWARD and "cached" in p["rids"])
    assert first["pre"][first["rids"].index("cached")] == 15, "a prefix-cache hit"
    assert any(k is Kind.DISCARD for k, _, _ in records), "an abort discarded a pending result"
    assert served.outputs["stopper"]["meta_info"]["finish_reason"] == {"type": "stop", "matched": served.stop_string}
    assert len(served.outputs) >= 24 + 2


def test_reexecution_with_the_serving_checkpoint_proves_every_request(served: ServedLog,
                                                                      reexecuted: dict[str, Any]) -> None:
    assert set(reexecuted) == {"probe", "hidden", "cached", *served.outputs}
    assert all(r["status"] == "proven" for r in reexecuted.values())
    for rid, out in served.outputs.items():
        assert reexecuted[rid]["tokens_checked"] == len(out["output_ids"]), rid
    assert reexecuted["g1"]["logprobs_checked"] >= reexecuted["g1"]["tokens_checked"] > 0
    assert sum(r["discarded_rerun"] for r in reexecuted.values()) >= 1, "discarded results are re-run too"


def test_grammar_constrained_request_reexecutes(served: ServedLog, reexecuted: dict[str, Any]) -> None:
    assert reexecuted["grammar"]["status"] == "proven" and reexecuted["grammar"]["tokens_checked"] >= 4
    ran = cli("replay", "--log-dir", served.log, "--reexecute", "--rid", "grammar", "--json")
    assert ran.rc == 0, ran.err
    assert [r["rid"] for r in ran.json()["requests"]] == ["grammar"]


def test_other_weights_of_the_same_shape_diverge_naming_request_and_position(
        served: ServedLog, tmp_path: Path) -> None:
    other = build_checkpoint(tmp_path / "other", CheckpointSpec(architecture="LlamaForCausalLM", seed=11))
    ran = cli("replay", "--log-dir", served.log, "--reexecute", "--model-path", other)
    assert ran.rc == 1, ran.out + ran.err
    assert "Traceback" not in ran.out + ran.err
    assert "first divergence: probe at token at output position 0" in ran.out
    body = cli("replay", "--log-dir", served.log, "--reexecute", "--model-path", other, "--json").json()
    first = body["requests"][0]
    assert (first["rid"], first["status"], first["divergence"]["position"]) == ("probe", "diverged", 0)
    assert all(r["status"] == "diverged" for r in body["requests"] if r["tokens_checked"])


def _edit_commit(served: ServedLog, rid: str, position: int) -> tuple[list[Any], int, int]:
    """The COMMIT holding `rid`'s output token at `position`, with that token changed."""
    records = entries(served.log)
    seen = 0
    for _, _, entry in records:
        if entry.kind is Kind.COMMIT and entry.rid == rid and entry.payload["ids"]:
            if seen == position:
                original = entry.payload["ids"][0]
                entry.payload["ids"] = [(original + 1) % 512]
                return records, original, entry.payload["ids"][0]
            seen += 1
    raise AssertionError(f"no COMMIT of {rid} at {position}")


def test_edited_commit_with_rechained_log_passes_verify_but_fails_reexecution(served: ServedLog, tmp_path: Path) -> None:
    log = tmp_path / "edited"
    shutil.copytree(served.log, log)
    records, original, edited = _edit_commit(served, "g4", 3)
    rewrite_rechained(log, records)
    assert cli("verify", "--log-dir", log).rc == 0, "the edit is invisible to the chain"
    ran = cli("replay", "--log-dir", log, "--reexecute", "--json")
    assert ran.rc == 1, ran.err
    found = {r["rid"]: r for r in ran.json()["requests"]}
    assert found["g4"]["divergence"] == {"position": 3, "what": "token", "logged": edited, "recomputed": original}
    assert [rid for rid, r in found.items() if r["status"] != "proven"] == ["g4"], "forcing keeps the rest exact"


def test_isolated_reexecution_proves_tokens_within_the_tolerance(served: ServedLog) -> None:
    ran = cli("replay", "--log-dir", served.log, "--reexecute", "--isolated", "--json")
    assert ran.rc == 0, ran.out + ran.err
    body = ran.json()
    assert body["mode"] == "isolated" and body["logprob_tolerance"] == 1e-4
    assert all(r["status"] == "proven" for r in body["requests"])


def test_logprob_one_ulp_off_diverges_bit_for_bit_but_passes_isolated(served: ServedLog, tmp_path: Path) -> None:
    log = tmp_path / "ulp"
    shutil.copytree(served.log, log)
    records = entries(served.log)
    commit = next(e for _, _, e in records if e.kind is Kind.COMMIT and e.rid == "g2" and e.payload["lp"])
    logged = commit.payload["lp"][0]
    commit.payload["lp"] = [math.nextafter(logged, 0.0)]
    rewrite_rechained(log, records)
    exact = {r["rid"]: r for r in cli("replay", "--log-dir", log, "--reexecute", "--json").json()["requests"]}
    assert exact["g2"]["divergence"] == {"position": 0, "what": "logprob", "logged": commit.payload["lp"][0],
                                         "recomputed": logged}
    ran = cli("replay", "--log-dir", log, "--reexecute", "--isolated", "--rid", "g2", "--json")
    assert ran.rc == 0 and ran.json()["requests"][0]["status"] == "proven", ran.out


def test_forward_record_edited_with_rechained_log_is_a_schedule_divergence(served: ServedLog, tmp_path: Path) -> None:
    log = tmp_path / "schedule"
    shutil.copytree(served.log, log)
    records = entries(served.log)
    # A forward in which g5 decodes (one new token past its prompt): alone with other decodes, or riding
    # in a prefill chunk's forward (the Engine mixes them by default).
    forward = next(e for _, _, e in records if e.kind is Kind.FORWARD and "g5" in e.payload["rids"]
                   and e.payload["mode"] != "extend" and e.payload["n"][e.payload["rids"].index("g5")] == 1
                   and e.payload["pre"][e.payload["rids"].index("g5")] > 0)
    at = forward.payload["rids"].index("g5")
    forward.payload["pre"][at] += 1  # a decode position this request never had
    rewrite_rechained(log, records)
    assert cli("verify", "--log-dir", log).rc == 0
    ran = cli("replay", "--log-dir", log, "--reexecute", "--json")
    assert ran.rc == 1 and "Traceback" not in ran.err
    found = {r["rid"]: r for r in ran.json()["requests"]}
    assert found["g5"]["status"] == "diverged" and found["g5"]["divergence"]["what"] == "schedule"


def test_edited_stop_string_match_is_an_outcome_divergence(served: ServedLog, tmp_path: Path) -> None:
    """Tokens and logprobs untouched: only what the result path decided (the stop string it matched)
    differs, in the finishing COMMIT and the FINISH alike, so every verify check still holds."""
    log = tmp_path / "finish"
    shutil.copytree(served.log, log)
    records = entries(served.log)
    for _, _, e in records:
        if e.rid == "stopper" and e.kind is Kind.COMMIT and e.payload["fin"]:
            e.payload["fin"] = ["stop", "zzz"]
        elif e.rid == "stopper" and e.kind is Kind.FINISH:
            e.payload["matched"] = "zzz"
    rewrite_rechained(log, records)
    assert cli("verify", "--log-dir", log).rc == 0
    found = {r["rid"]: r for r in cli("replay", "--log-dir", log, "--reexecute", "--json").json()["requests"]}
    divergence = found["stopper"]["divergence"]
    assert divergence["what"] == "outcome" and "'zzz'" in divergence["logged"], divergence
    assert [rid for rid, r in found.items() if r["status"] != "proven"] == ["stopper"]


@pytest.mark.parametrize("settings", [{"enable_mixed_chunk": True}, {"disable_overlap_schedule": True},
                                      {"torch_compile": "on"}], ids=["mixed-chunk", "no-overlap", "compiled-trunk"])
def test_other_schedules_reexecute_bit_for_bit(tiny_checkpoint: Any, tmp_path: Path, settings: dict[str, Any]) -> None:
    from server import Engine

    engine = Engine(model_path=str(tiny_checkpoint("llama")), log_dir=str(tmp_path / "log"), max_total_tokens=4096,
                    chunked_prefill_size=16, log_durability="none", **{"enable_mixed_chunk": False, **settings})
    try:
        engine.generate(input_ids=[[(5 * i + j) % 300 + 3 for j in range(6 + 11 * i)] for i in range(6)],
                        sampling_params=[{"max_new_tokens": 10, "ignore_eos": True, "temperature": 0.7 * (i % 2),
                                          "seed": i} for i in range(6)], return_logprob=True)
    finally:
        engine.shutdown()
    modes = {p["mode"] for k, _, p in kinds(tmp_path / "log") if k is Kind.FORWARD}
    assert "mixed" in modes if settings.get("enable_mixed_chunk") else modes == {"extend", "decode"}
    ran = cli("replay", "--log-dir", tmp_path / "log", "--reexecute", "--json")
    assert ran.rc == 0, ran.out + ran.err
    assert [r["tokens_checked"] for r in ran.json()["requests"]] == [10] * 6


def test_edited_hidden_state_is_a_divergence(served: ServedLog, tmp_path: Path) -> None:
    log = tmp_path / "hidden"
    shutil.copytree(served.log, log)
    records = entries(served.log)
    commit = [e for _, _, e in records if e.kind is Kind.COMMIT and e.rid == "hidden" and e.payload["hs"]][2]
    row = bytearray(commit.payload["hs"][0])
    row[0] ^= 1  # the lowest mantissa bit of the first float
    commit.payload["hs"] = [bytes(row)]
    rewrite_rechained(log, records)
    found = {r["rid"]: r for r in cli("replay", "--log-dir", log, "--reexecute", "--json").json()["requests"]}
    assert (found["hidden"]["divergence"]["what"], found["hidden"]["divergence"]["position"]) == ("hidden state", 2)
    assert [rid for rid, r in found.items() if r["status"] != "proven"] == ["hidden"]


def test_a_cache_hit_the_rebuilt_engine_cannot_match_is_a_schedule_divergence(served: ServedLog,
                                                                              tmp_path: Path) -> None:
    log = tmp_path / "no-cache"
    shutil.copytree(served.log, log)
    records = entries(served.log)
    for i, (lsn, ts, entry) in enumerate(records):
        if entry.kind is Kind.SERVER_START:  # the log now claims the server ran without the prefix cache
            engine = {**entry.payload["engine"], "radix_cache": False}
            records[i] = (lsn, ts, type(entry)(entry.kind, entry.rid, {**entry.payload, "engine": engine}))
    rewrite_rechained(log, records)
    ran = cli("replay", "--log-dir", log, "--reexecute", "--json")
    assert ran.rc == 1 and "Traceback" not in ran.err, ran.err
    found = {r["rid"]: r for r in ran.json()["requests"]}
    divergence = found["cached"]["divergence"]
    assert found["cached"]["status"] == "diverged" and divergence["what"] == "schedule", found["cached"]
    assert "logged extend [15, +1) but 0 of 16 prompt tokens were scheduled" in divergence["logged"]


def test_server_start_names_the_kernel_builds_and_reexecution_says_when_this_machine_runs_others(
        served: ServedLog, tmp_path: Path) -> None:
    """SERVER_START records each C kernel the engine ran by its build (source, compiler, flags and CPU
    hashed). On the same builds re-execution notes nothing; on others it says so, since a divergence there
    would say nothing about the log. The tokens themselves are still checked (here they still match)."""
    from kernels.builds import current_builds

    records = entries(served.log)
    start = next(e for _, _, e in records if e.kind is Kind.SERVER_START)
    logged = start.payload["engine"]["kernels"]
    assert {"paged_attention.c", "gather_rows.c"} <= set(logged)  # the C attention kernel and the batch gather
    assert logged == current_builds(sorted(logged))
    same = cli("replay", "--log-dir", served.log, "--reexecute", "--json")
    assert same.rc == 0 and same.json()["build_differences"] == []

    log = tmp_path / "other-build"
    shutil.copytree(served.log, log)
    for i, (lsn, ts, entry) in enumerate(records):
        if entry.kind is Kind.SERVER_START:  # as if served by another build of the kernel, on another torch
            engine = {**entry.payload["engine"], "software": "torch 0.0 riscv64 none",
                      "kernels": {**logged, "paged_attention.c": "paged_attention-0123456789abcdef"}}
            records[i] = (lsn, ts, type(entry)(entry.kind, entry.rid, {**entry.payload, "engine": engine}))
    rewrite_rechained(log, records)
    other = cli("replay", "--log-dir", log, "--reexecute", "--json")
    assert other.rc == 0, other.err
    notes = other.json()["build_differences"]
    assert len(notes) == 2
    assert "torch 0.0 riscv64 none" in notes[0]
    assert "paged_attention-0123456789abcdef" in notes[1] and logged["paged_attention.c"] in notes[1]
    text = cli("replay", "--log-dir", log, "--reexecute")
    assert "this machine is not the one that served" in text.out and "paged_attention.c" in text.out
    # A log from before the key has no builds to compare, and no note is made up for them.
    older = {k: v for k, v in start.payload["engine"].items() if k != "kernels"}
    from ops.reexec.runtime import build_differences
    assert build_differences(older) == []
