"""`tokenledger bench serve`: load any OpenAI-compatible server (`/v1/completions`, streaming)
with random prompts and report throughput and TTFT / TPOT / ITL / E2E percentiles; with
`--abort-fraction`, also abort latency and the KV still in use after the drain."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

import httpx

from ops.loadgen import AbortWay, LoadConfig, PlannedRequest, RequestTiming, run_load

PERCENTILES = (50, 90, 99)
# Gauges a server exposes for KV in use: ours in tokens, vLLM's as a fraction of the cache.
KV_GAUGES = ("tokenledger_kv_used_tokens", "sglang:num_used_tokens", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="load an OpenAI-compatible server: tok/s, TTFT/TPOT/ITL/E2E, aborts")
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--model", default=None, help="model name to send (default: the server's first /v1/models)")
    p.add_argument("--tokenizer", default=None, help="tokenizer/model directory (default: the demo model's)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths drawn from [len*(1-r), len*(1+r)]")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); default: all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--abort-fraction", type=float, default=0.0,
                   help="share of requests aborted at a random time (half /abort_request, half disconnect)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--server-default-temperature", action="store_true",
                   help="send no temperature (the server's default sampling, as vllm bench serve does); default: greedy")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(run=run)


@dataclass(frozen=True, slots=True)
class Summary:
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    aborted: int
    abort_latency_ms: dict[str, float]
    kv_in_use_after_drain: float | None
    # By way: "api" (call -> final chunk) and "disconnect" (close -> the abort durable at the server).
    abort_latency_ms_by_way: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def abort_latency_steps(self) -> dict[str, dict[str, float]]:
        """Abort latency in decode steps (ms over this run's mean TPOT), all aborts and by way."""
        tpot = self.tpot_ms.get("mean")
        if not tpot:
            return {}
        kinds = {"all": self.abort_latency_ms, **self.abort_latency_ms_by_way}
        return {kind: {k: round(v / tpot, 3) for k, v in st.items()} for kind, st in kinds.items() if st}

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.duration_s

    @property
    def total_tok_s(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration_s

    def to_dict(self) -> dict[str, Any]:
        return {"completed": self.completed, "failed": self.failed, "duration_s": round(self.duration_s, 3),
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "output_tok_s": round(self.output_tok_s, 2), "total_tok_s": round(self.total_tok_s, 2),
                "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "itl_ms": self.itl_ms, "e2e_ms": self.e2e_ms,
                "aborted": self.aborted, "abort_latency_ms": self.abort_latency_ms,
                "abort_latency_ms_by_way": self.abort_latency_ms_by_way, "abort_latency_steps": self.abort_latency_steps,
                "kv_in_use_after_drain": self.kv_in_use_after_drain}


def plan_requests(args: argparse.Namespace, tokenizer: Any) -> list[PlannedRequest]:
    """Random token ids decoded to text (as `vllm bench serve`'s random dataset does), adjusted until
    the text re-encodes to the drawn length (`_text_of_length`); the prompt's token count is the
    re-encoded text's."""
    rng = random.Random(args.seed)
    vocab = tokenizer.vocab_size
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    plan = []
    for i in range(args.num_prompts):
        n_in = _draw(rng, args.input_len, args.range_ratio)
        n_out = _draw(rng, args.output_len, args.range_ratio)
        text = _text_of_length(tokenizer, n_in, rng, [t for t in range(vocab) if t not in special])
        way = AbortWay.NONE
        if rng.random() < args.abort_fraction:
            way = AbortWay.API if i % 2 == 0 else AbortWay.DISCONNECT
        plan.append(PlannedRequest(text, len(tokenizer.encode(text, add_special_tokens=False)), n_out, way,
                                   rng.uniform(0.0, 0.5)))
    return plan


def _text_of_length(tokenizer: Any, length: int, rng: random.Random, usable: list[int], tries: int = 10) -> str:
    """Text of random tokens that re-encodes to `length` tokens where a few rounds reach it: decoding
    random ids and encoding the text merges and splits tokens (with a byte-level BPE, 256 random ids
    re-encode to ~330), so a load meant as 256 in would send a third more. Each round keeps the
    re-encoding's first `length` ids, or tops it up with fresh random ids, and decodes again."""
    ids = [rng.choice(usable) for _ in range(length)]
    text = tokenizer.decode(ids)
    for _ in range(tries):
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == length:
            break
        ids = encoded[:length] + [rng.choice(usable) for _ in range(length - len(encoded))]
        text = tokenizer.decode(ids)
    return text


def _draw(rng: random.Random, length: int, ratio: float) -> int:
    low, high = max(1, int(length * (1 - ratio))), max(1, int(length * (1 + ratio)))
    return rng.randint(low, high)


def summarize(timings: list[RequestTiming], duration_s: float, kv_after: float | None) -> Summary:
    done = [t for t in timings if t.ok]
    whole = [t for t in done if t.aborted_by is AbortWay.NONE]
    aborted = [t for t in done if t.aborted_by is not AbortWay.NONE]
    return Summary(
        completed=len(done), failed=len(timings) - len(done), duration_s=duration_s,
        input_tokens=sum(t.prompt_tokens for t in done), output_tokens=sum(t.output_tokens for t in done),
        ttft_ms=_stats([t.ttft_s for t in whole]), tpot_ms=_stats([t.tpot_s for t in whole if t.tpot_s is not None]),
        itl_ms=_stats([x for t in whole for x in t.itl_s]), e2e_ms=_stats([t.e2e_s for t in whole]),
        aborted=len(aborted),
        abort_latency_ms=_stats([t.abort_latency_s for t in aborted if t.abort_latency_s is not None]),
        kv_in_use_after_drain=kv_after,
        abort_latency_ms_by_way={way.value: st for way in (AbortWay.API, AbortWay.DISCONNECT) if (st := _stats(
            [t.abort_latency_s for t in aborted if t.aborted_by is way and t.abort_latency_s is not None]))})


def _stats(values_s: list[float]) -> dict[str, float]:
    if not values_s:
        return {}
    ms = sorted(v * 1000 for v in values_s)
    out = {"mean": statistics.fmean(ms), "median": statistics.median(ms)}
    for p in PERCENTILES[1:]:
        out[f"p{p}"] = ms[min(len(ms) - 1, max(0, round(p / 100 * len(ms) + 0.5) - 1))]
    return {k: round(v, 3) for k, v in out.items()}


def kv_in_use(base_url: str, api_key: str | None) -> float | None:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        text = httpx.get(f"{base_url}/metrics", headers=headers, timeout=10).text
    except httpx.HTTPError:
        return None
    for gauge in KV_GAUGES:
        match = re.search(rf"^{re.escape(gauge)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.MULTILINE)
        if match:
            return float(match.group(1))
    return None


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from server.models.demo import model_dir_for

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir_for(args.tokenizer)))
    model = args.model or httpx.get(f"{args.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    plan = plan_requests(args, tokenizer)
    cfg = LoadConfig(args.base_url, model, args.request_rate, args.max_concurrency, args.api_key, args.seed,
                     temperature=None if args.server_default_temperature else 0.0)
    timings, duration = _run_with_progress(cfg, plan, show=not (args.no_progress or args.json))
    summary = summarize(timings, duration, kv_in_use(args.base_url, args.api_key))
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        print_table(summary)
    errors = [t.error for t in timings if t.error]
    if errors:
        print(f"{len(errors)} request(s) failed; first: {errors[0]}")
    return 0 if not errors else 1


def _run_with_progress(cfg: LoadConfig, plan: list[PlannedRequest], show: bool) -> tuple[list[RequestTiming], float]:
    from rich.progress import Progress

    with Progress(disable=not show, transient=True) as progress:
        task = progress.add_task("requests", total=len(plan))
        return asyncio.run(run_load(cfg, plan, lambda _t: progress.advance(task)))


def print_table(s: Summary) -> None:
    print(f"{'requests completed / failed':32} {s.completed} / {s.failed}")
    print(f"{'duration (s)':32} {s.duration_s:.2f}")
    print(f"{'output tok/s':32} {s.output_tok_s:.1f}")
    print(f"{'total tok/s':32} {s.total_tok_s:.1f}")
    print(f"{'metric (ms)':17} {'mean':>10} {'median':>10} {'p90':>10} {'p99':>10}")
    rows = [("TTFT", s.ttft_ms), ("TPOT", s.tpot_ms), ("ITL", s.itl_ms), ("E2E", s.e2e_ms)]
    if s.aborted:
        rows += [("abort", s.abort_latency_ms), *((f"abort {w}", st) for w, st in s.abort_latency_ms_by_way.items())]
    _print_rows(rows)
    if s.abort_latency_steps:
        print(f"{'abort (steps)':17} {'mean':>10} {'median':>10} {'p90':>10} {'p99':>10}   (ms / mean TPOT)")
        _print_rows([("abort" if kind == "all" else f"abort {kind}", st) for kind, st in s.abort_latency_steps.items()])
    if s.aborted:
        print(f"{'aborted requests':32} {s.aborted}")
    if s.kv_in_use_after_drain is not None:
        print(f"{'KV in use after the drain':32} {s.kv_in_use_after_drain:g}")


def _print_rows(rows: list[tuple[str, dict[str, float]]]) -> None:
    for name, st in rows:
        print(f"{name:17} " + " ".join(f"{st.get(k, float('nan')):10.2f}" for k in ("mean", "median", "p90", "p99")))
