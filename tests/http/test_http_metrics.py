"""/metrics' shape (issue 15, item 6): a model_name label on every series, latency and token
histograms, finished requests by reason, SGLang's names on request, parseable by prometheus_client."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from server.http.metrics import SGLANG_NAMES, Metrics, RequestTiming
from server.messages import StatsMsg


def _families(metrics: Metrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}


def _feed(metrics: Metrics) -> None:
    metrics.on_stats(StatsMsg(running=1, waiting=2, kv_used=3, kv_total=4, durable_lsn=5, generated=7))
    timing = RequestTiming(arrival=10.0)
    metrics.on_tokens(timing, 10.5, 1)  # first token: TTFT 0.5 s
    metrics.on_tokens(timing, 10.9, 2)  # two tokens in one step: two gaps of 0.2 s
    metrics.on_finish(1.25, prompt_tokens=9, output_tokens=3, reason="length")


def test_every_sample_carries_model_name_and_the_histograms_count_what_happened():
    metrics = Metrics("tiny-model")
    _feed(metrics)
    families = _families(metrics)
    for family in families.values():
        for sample in family.samples:
            assert sample.labels.get("model_name") == "tiny-model", sample
    def value(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, {"model_name": "tiny-model", **labels})

    assert value("tokenledger_time_to_first_token_seconds_count") == 1
    assert value("tokenledger_time_to_first_token_seconds_sum") == 0.5
    assert value("tokenledger_inter_token_latency_seconds_count") == 2
    assert abs(value("tokenledger_inter_token_latency_seconds_sum") - 0.4) < 1e-9
    assert value("tokenledger_e2e_request_latency_seconds_sum") == 1.25
    assert value("tokenledger_request_prompt_tokens_sum") == 9 and value("tokenledger_request_generation_tokens_sum") == 3
    assert value("tokenledger_requests_finished_total", reason="length") == 1
    assert value("tokenledger_prompt_tokens_total") == 9 and value("tokenledger_generated_tokens_total") == 7
    assert value("tokenledger_requests_waiting") == 2


def test_sglang_names_replace_ours_where_sglang_has_the_series():
    metrics = Metrics("m", sglang_names=True)
    _feed(metrics)
    names = {s.name for f in _families(metrics).values() for s in f.samples}
    assert "sglang:num_running_reqs" in names and "sglang:time_to_first_token_seconds_bucket" in names
    assert "sglang:generation_tokens_total" in names and "sglang:e2e_request_latency_seconds_sum" in names
    for ours in SGLANG_NAMES:
        assert not any(n == ours or n.startswith(ours + "_") for n in names), ours
    assert "tokenledger_wal_durable_lsn" in names  # no SGLang counterpart: our name stays
    assert metrics.durable_lsn_now() == 5


def test_the_serve_flag_reaches_the_front_metrics_with_the_served_model_name():
    from types import SimpleNamespace

    from ops.cli import build_parser
    from ops.server_args import server_args_from
    from server.http.front import Front

    args = server_args_from(build_parser().parse_args(["serve", "--enable-metrics-sglang-names"]))
    front = Front(args, SimpleNamespace(), SimpleNamespace(), "served-name")  # type: ignore[arg-type]
    text = front.metrics.render().decode()
    assert 'sglang:num_running_reqs{model_name="served-name"}' in text
    assert "tokenledger_requests_running" not in text
