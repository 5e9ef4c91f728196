"""A log served by the real engine under concurrent load, for the re-execution tests: greedy and
seeded-sampling requests, chunked prefill, the overlap loop, aborts, stop strings, a grammar."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commitlog import Entry, Kind, LogReader
from commitlog.codec import GENESIS_HASH, encode_value, lsn_key
from commitlog.wal import Wal

REGEX = r"(cat|dog)-[0-9]{2,4}"
NUM_BATCH = 24


@dataclass
class ServedLog:
    log: Path
    model: Path
    outputs: dict[str, Any]
    stop_string: str


def _batch(stop: str) -> tuple[list[list[int]], list[dict[str, Any]], list[str]]:
    prompts, params, rids = [], [], []
    for i in range(NUM_BATCH):
        prompts.append([(7 * i + j) % 500 + 3 for j in range(5 + (i * 7) % 37)])  # up to 41: chunks of 16
        if i % 3 == 0:
            p: dict[str, Any] = {"temperature": 0.9, "top_p": 0.95, "seed": 1000 + i}
        else:
            p = {"temperature": 0}
        params.append({"max_new_tokens": 6 + i % 7, "ignore_eos": True, **p})
        rids.append(f"{'s' if i % 3 == 0 else 'g'}{i}")
    prompts.append([40, 41, 42, 43, 44])
    params.append({"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [stop]})
    rids.append("stopper")
    prompts.append([9, 8, 7])
    params.append({"max_new_tokens": 12, "temperature": 0.8, "seed": 5, "regex": REGEX})
    rids.append("grammar")
    return prompts, params, rids


def _wait_decoding(engine: Any, rid: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        req = engine.scheduler.reqs.get(rid)
        if req is not None and len(req.output_ids) >= 2:
            return
        time.sleep(0.01)


def serve_log(model: Path, log: Path) -> ServedLog:
    from server import Engine

    engine = Engine(model_path=str(model), log_dir=str(log), max_total_tokens=8192, chunked_prefill_size=16,
                    log_durability="none")
    try:
        probe = engine.generate(input_ids=[40, 41, 42, 43, 44], sampling_params={"max_new_tokens": 24, "temperature": 0,
                                                                                 "ignore_eos": True}, rid="probe")
        stop = probe["text"][4:7]
        # The probe's committed KV is in the prefix cache: this one starts from a 15-token hit.
        engine.generate(input_ids=[40, 41, 42, 43, 44, *probe["output_ids"][:10], 7],
                        sampling_params={"max_new_tokens": 6, "temperature": 0}, return_logprob=True, rid="cached")
        engine.generate(input_ids=[3, 1, 4, 1, 5], sampling_params={"max_new_tokens": 5, "temperature": 0},
                        return_hidden_states=True, rid="hidden")
        prompts, params, rids = _batch(stop)
        outputs: dict[str, Any] = {}
        victims = ["victim-a", "victim-b"]

        def victim(rid: str) -> None:
            outputs[rid] = engine.generate(input_ids=list(range(100, 140)), sampling_params={
                "max_new_tokens": 1500, "temperature": 0, "ignore_eos": True}, return_logprob=True, rid=rid)

        threads = [threading.Thread(target=victim, args=(rid,)) for rid in victims]
        for t in threads:
            t.start()
        batch = threading.Thread(target=lambda: outputs.update({o["meta_info"]["id"]: o for o in engine.generate(
            input_ids=prompts, sampling_params=params, return_logprob=True, top_logprobs_num=2, rid=rids)}))
        batch.start()
        # One abort while the batch's prompts are still prefilling (its forwards may be extends the
        # victim is not in: then it has no result pending and finishes at once, no DISCARD), one once
        # the batch is done, when the victim decodes alone under overlap: its pending result is discarded.
        _wait_decoding(engine, victims[0])
        engine.abort(victims[0])
        batch.join(120)
        _wait_decoding(engine, victims[1])
        engine.abort(victims[1])
        for t in threads:
            t.join(120)
    finally:
        engine.shutdown()
    return ServedLog(log, model, outputs, stop)


def entries(log: Path) -> list[tuple[int, int, Entry]]:
    reader = LogReader.open(log)
    try:
        return [(r.lsn, r.ts_ns, Entry(r.kind, r.rid, r.payload)) for r in reader.records()]
    finally:
        reader.close()


def rewrite_rechained(log: Path, records: list[tuple[int, int, Entry]]) -> None:
    """Replace the records with `records`, CRCs valid and the hash chain recomputed: only a published
    head (or re-execution) can tell."""
    wal = Wal.open(log)
    prev = GENESIS_HASH
    try:
        with wal.env.begin(write=True) as txn:
            txn.drop(wal.records, delete=False)
            for lsn, ts, entry in records:
                value, prev = encode_value(lsn, entry, ts, prev)
                txn.put(lsn_key(lsn), value, db=wal.records)
    finally:
        wal.close()


def kinds(log: Path) -> list[tuple[Kind, str | None, dict[str, Any]]]:
    return [(e.kind, e.rid, e.payload) for _, _, e in entries(log)]
