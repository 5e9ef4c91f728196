"""`tokenledger bench serve` against the real server: every request accounted for, aborts by
API and by disconnect measured to their end, and the KV back to zero after the drain."""
from __future__ import annotations

import argparse
import asyncio
import time

from ops.bench_serve import kv_in_use, plan_requests, summarize
from ops.loadgen import AbortWay, LoadConfig, run_load


def test_bench_serve_measures_every_request_and_both_abort_ways(server):
    import httpx
    from transformers import AutoTokenizer

    model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    tokenizer = AutoTokenizer.from_pretrained(str(server.model_dir))
    args = argparse.Namespace(num_prompts=8, input_len=24, output_len=1200, range_ratio=0.0, seed=3,
                              abort_fraction=1.0)
    plan = plan_requests(args, tokenizer)
    # Two run to their end. The six aborted ask for 1,200 tokens, aborts come within 0.5 s of the first
    # token: a client starved of CPU reads a stream late and in bursts, and at 400 tokens it saw some
    # streams end before their abort was due (a fast host, the CPU busy beside the test).
    plan[6:] = [p.__class__(p.prompt, p.prompt_tokens, 8) for p in plan[6:]]
    timings, duration = asyncio.run(run_load(LoadConfig(server.url, model, max_concurrency=8), plan))
    deadline = time.monotonic() + 10  # the gauge follows the scheduler's next stats report
    while (kv := kv_in_use(server.url, None)) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    summary = summarize(timings, duration, kv)

    assert summary.failed == 0 and summary.completed == 8, [t.error for t in timings]
    ways = [t.aborted_by for t in timings]
    assert ways[:6] == [AbortWay.API, AbortWay.DISCONNECT] * 3 and ways[6:] == [AbortWay.NONE] * 2
    assert all(t.abort_latency_s is not None and t.output_tokens < 1200 for t in timings[:6]), \
        [(t.aborted_by, t.abort_latency_s, t.output_tokens) for t in timings[:6]]
    assert [t.output_tokens for t in timings[6:]] == [8, 8]
    assert summary.kv_in_use_after_drain == 0
    assert set(summary.ttft_ms) == {"mean", "median", "p90", "p99"} and summary.abort_latency_ms["p99"] > 0
    # Each way on its own, and in decode steps (ms over the same run's mean TPOT), as issue 11's target is.
    assert set(summary.abort_latency_ms_by_way) == {"api", "disconnect"}
    assert all(st["p99"] > 0 for st in summary.abort_latency_ms_by_way.values())
    steps = summary.abort_latency_steps
    assert set(steps) == {"all", "api", "disconnect"}
    assert steps["all"]["p99"] == round(summary.abort_latency_ms["p99"] / summary.tpot_ms["mean"], 3)
