"""Prometheus metrics: gauges and counters fed by the scheduler's stats, plus the front's
per-request timings. Every series carries `model_name`, as SGLang's and vLLM's do, so one
dashboard charts several servers; `--enable-metrics-sglang-names` renames the series that
have an SGLang counterpart to SGLang's name (docs/api.md has the mapping)."""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from commitlog import DoomSource
from server.messages import StatsMsg

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# Our name -> SGLang's (sglang/srt/metrics), for the series both servers export.
SGLANG_NAMES = {
    "tokenledger_requests_running": "sglang:num_running_reqs",
    "tokenledger_requests_waiting": "sglang:num_queue_reqs",
    "tokenledger_kv_used_tokens": "sglang:num_used_tokens",
    "tokenledger_time_to_first_token_seconds": "sglang:time_to_first_token_seconds",
    "tokenledger_inter_token_latency_seconds": "sglang:inter_token_latency_seconds",
    "tokenledger_e2e_request_latency_seconds": "sglang:e2e_request_latency_seconds",
    "tokenledger_request_prompt_tokens": "sglang:prompt_tokens_histogram",
    "tokenledger_request_generation_tokens": "sglang:generation_tokens_histogram",
    "tokenledger_prompt_tokens_total": "sglang:prompt_tokens_total",
    "tokenledger_generated_tokens_total": "sglang:generation_tokens_total",
}
MODEL = ("model_name",)


@dataclass(slots=True)
class RequestTiming:
    """One request's clock, kept by the front while it follows the request's deltas."""

    arrival: float
    last_token: float | None = None


class Metrics:
    def __init__(self, model_name: str = "", sglang_names: bool = False) -> None:
        r = self.registry = CollectorRegistry()
        self.model_name = model_name
        self._sglang = sglang_names

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(self._name(name), doc, MODEL, registry=r).labels(model_name)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(self._name(name), doc, MODEL, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("tokenledger_requests_running", "Requests admitted and not finished")
        self.waiting = gauge("tokenledger_requests_waiting", "Requests queued for admission")
        self.kv_used = gauge("tokenledger_kv_used_tokens", "KV slots held by live requests")
        self.kv_cached = gauge("tokenledger_kv_cached_tokens", "KV slots held by the prefix cache")
        self.kv_total = gauge("tokenledger_kv_total_tokens", "KV slots in the pool")
        self.durable_lsn = gauge("tokenledger_wal_durable_lsn", "Highest durable log sequence number")
        self.aborts = Counter("tokenledger_aborts_total", "Aborts received, by source", ["source", *MODEL], registry=r)
        self.finished = Counter("tokenledger_requests_finished_total", "Requests finished, by finish reason",
                                ["reason", *MODEL], registry=r)
        self.discarded = self._counter("tokenledger_discarded_results_total", "Results discarded by a doomed txn")
        self.generated = self._counter("tokenledger_generated_tokens_total", "Output tokens committed")
        self.prefix_query = self._counter("tokenledger_prefix_cache_query_tokens_total",
                                          "Prompt tokens of admitted requests")
        self.prefix_hit = self._counter("tokenledger_prefix_cache_hit_tokens_total",
                                        "Prompt tokens served from the prefix cache (hit rate: this / query)")
        self.prompt_total = self._counter("tokenledger_prompt_tokens_total", "Prompt tokens of finished requests")
        self.step_time = hist("tokenledger_step_seconds", "Forward step time", LATENCY_BUCKETS)
        self.ttft = hist("tokenledger_time_to_first_token_seconds", "Arrival to first durable token", LATENCY_BUCKETS)
        self.itl = hist("tokenledger_inter_token_latency_seconds", "Gap between durable tokens, per token",
                        LATENCY_BUCKETS)
        self.e2e = hist("tokenledger_e2e_request_latency_seconds", "Arrival to finish", E2E_BUCKETS)
        self.prompt_tokens = hist("tokenledger_request_prompt_tokens", "Prompt tokens per finished request", TOKEN_BUCKETS)
        self.generation_tokens = hist("tokenledger_request_generation_tokens", "Output tokens per finished request",
                                      TOKEN_BUCKETS)
        self.wal_commit = hist("tokenledger_wal_group_commit_seconds", "Group flush to durable", LATENCY_BUCKETS)
        # The server's share of an abort's latency: what a client adds (its own loop, the wire) is not in it.
        self.abort_time = hist("tokenledger_abort_seconds",
                               "An abort sent to the scheduler to its finish durable and back at the front, per live request",
                               LATENCY_BUCKETS)
        for source in DoomSource:  # every source shows from the start, at 0
            self.aborts.labels(source=source.value, model_name=model_name)
        self._seen_aborts: dict[str, int] = {}
        self._seen_discarded = 0
        self._seen_generated = 0
        self._seen_query = 0
        self._seen_hit = 0

    def _name(self, name: str) -> str:
        return SGLANG_NAMES.get(name, name) if self._sglang else name

    def _counter(self, name: str, doc: str) -> Counter:
        # prometheus_client appends `_total` to a counter's name itself.
        return Counter(self._name(name).removesuffix("_total"), doc, MODEL, registry=self.registry).labels(
            self.model_name)

    def on_stats(self, s: StatsMsg) -> None:
        self.running.set(s.running)
        self.waiting.set(s.waiting)
        self.kv_used.set(s.kv_used)
        self.kv_total.set(s.kv_total)
        self.kv_cached.set(s.kv_cached)
        self.durable_lsn.set(s.durable_lsn)
        for v in s.step_seconds:
            self.step_time.observe(v)
        for v in s.wal_commit_seconds:
            self.wal_commit.observe(v)
        # The scheduler reports running totals; counters only ever add the difference.
        for source, total in s.aborts.items():
            self.aborts.labels(source=source, model_name=self.model_name).inc(total - self._seen_aborts.get(source, 0))
            self._seen_aborts[source] = total
        self.discarded.inc(s.discarded - self._seen_discarded)
        self.generated.inc(s.generated - self._seen_generated)
        self._seen_discarded, self._seen_generated = s.discarded, s.generated
        self.prefix_query.inc(s.prefix_query_tokens - self._seen_query)
        self.prefix_hit.inc(s.prefix_hit_tokens - self._seen_hit)
        self._seen_query, self._seen_hit = s.prefix_query_tokens, s.prefix_hit_tokens

    def on_abort_finished(self, seconds: float) -> None:
        self.abort_time.observe(seconds)

    def on_tokens(self, timing: RequestTiming, now: float, count: int) -> None:
        """A delta of `count` durable tokens reached the front at `now`: the first one is the TTFT;
        later gaps are spread over the tokens they brought (one step may commit several)."""
        if count <= 0:
            return
        if timing.last_token is None:
            self.ttft.observe(now - timing.arrival)
        else:
            gap = (now - timing.last_token) / count
            for _ in range(count):
                self.itl.observe(gap)
        timing.last_token = now

    def on_finish(self, e2e_s: float, prompt_tokens: int, output_tokens: int, reason: str) -> None:
        self.e2e.observe(e2e_s)
        self.prompt_tokens.observe(prompt_tokens)
        self.generation_tokens.observe(output_tokens)
        self.prompt_total.inc(prompt_tokens)
        self.finished.labels(reason=reason, model_name=self.model_name).inc()

    def durable_lsn_now(self) -> int:
        value = self.registry.get_sample_value(self._name("tokenledger_wal_durable_lsn"),
                                               {"model_name": self.model_name})
        return int(value or 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def render_name_mapping() -> str:
    """The docs table of SGLANG_NAMES (docs/api.md holds this output)."""
    rows = ["| tokenledger | with --enable-metrics-sglang-names |", "| --- | --- |"]
    rows += [f"| `{ours}` | `{theirs}` |" for ours, theirs in SGLANG_NAMES.items()]
    return "\n".join(rows) + "\n"
