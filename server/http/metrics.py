"""Prometheus metrics: gauges and counters fed by the scheduler's stats, plus front timings."""
from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from commitlog import DoomSource
from server.messages import StatsMsg

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.running = Gauge("tokenledger_requests_running", "Requests admitted and not finished", registry=r)
        self.waiting = Gauge("tokenledger_requests_waiting", "Requests queued for admission", registry=r)
        self.kv_used = Gauge("tokenledger_kv_used_tokens", "KV slots held by live requests", registry=r)
        self.kv_cached = Gauge("tokenledger_kv_cached_tokens", "KV slots held by the prefix cache", registry=r)
        self.prefix_query = Counter("tokenledger_prefix_cache_query_tokens_total",
                                    "Prompt tokens of admitted requests", registry=r)
        self.prefix_hit = Counter("tokenledger_prefix_cache_hit_tokens_total",
                                  "Prompt tokens served from the prefix cache (hit rate: this / query)", registry=r)
        self.kv_total = Gauge("tokenledger_kv_total_tokens", "KV slots in the pool", registry=r)
        self.durable_lsn = Gauge("tokenledger_wal_durable_lsn", "Highest durable log sequence number", registry=r)
        self.aborts = Counter("tokenledger_aborts_total", "Aborts received, by source", ["source"], registry=r)
        self.discarded = Counter("tokenledger_discarded_results_total", "Results discarded by a doomed txn",
                                 registry=r)
        self.generated = Counter("tokenledger_generated_tokens_total", "Output tokens committed", registry=r)
        self.step_time = Histogram("tokenledger_step_seconds", "Forward step time", buckets=LATENCY_BUCKETS,
                                   registry=r)
        self.ttft = Histogram("tokenledger_time_to_first_token_seconds", "Arrival to first durable token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.wal_commit = Histogram("tokenledger_wal_group_commit_seconds", "Group flush to durable",
                                    buckets=LATENCY_BUCKETS, registry=r)
        for source in DoomSource:  # every source shows from the start, at 0
            self.aborts.labels(source=source.value)
        self._seen_aborts: dict[str, int] = {}
        self._seen_discarded = 0
        self._seen_generated = 0
        self._seen_query = 0
        self._seen_hit = 0

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
            self.aborts.labels(source=source).inc(total - self._seen_aborts.get(source, 0))
            self._seen_aborts[source] = total
        self.discarded.inc(s.discarded - self._seen_discarded)
        self.generated.inc(s.generated - self._seen_generated)
        self._seen_discarded, self._seen_generated = s.discarded, s.generated
        self.prefix_query.inc(s.prefix_query_tokens - self._seen_query)
        self.prefix_hit.inc(s.prefix_hit_tokens - self._seen_hit)
        self._seen_query, self._seen_hit = s.prefix_query_tokens, s.prefix_hit_tokens

    def render(self) -> bytes:
        return generate_latest(self.registry)
