"""Hostile bodies are 4xx naming their field and never stall the event loop: type confusions,
lone surrogates, deep nesting (issue 10 A.2), and bounded work per request (A.3)."""
from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest
from server_process import ServerProcess

HEALTH_BOUND_S = 1.0  # a liveness bound on a shared 2-core machine, not a speed benchmark
DEEP = 100_000


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    proc = ServerProcess(tiny_checkpoint("llama"), tmp_path_factory.mktemp("limits") / "log")
    proc.wait_healthy()
    yield proc
    assert proc.terminate() == 0, proc.stderr()


def model_name(server) -> str:
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


def post(server, route: str, content: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{server.url}{route}", content=content, headers={"content-type": "application/json"},
                      timeout=timeout)


def health_latency_while(server, work) -> tuple[object, float]:
    """Runs `work()` in a thread and returns its result and the slowest /health answer meanwhile."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(work)
        worst = 0.0
        while not future.done():
            t0 = time.monotonic()
            assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.02)
        return future.result(), worst


SAMPLING = '{"max_new_tokens": 2}'
BAD_BODIES = [
    ("/generate", '{"text": "a", "sampling_params": {"stop": 5}}', "stop"),
    ("/generate", '{"text": "a", "sampling_params": {"stop": [5]}}', "stop"),
    ("/generate", '{"text": "a", "sampling_params": {"stop_token_ids": 5}}', "stop_token_ids"),
    ("/generate", '{"text": "a", "sampling_params": {"stop_token_ids": ["x"]}}', "stop_token_ids"),
    ("/generate", '{"text": "bad\\ud800text", "sampling_params": ' + SAMPLING + '}', "text"),
    ("/generate", '{"text": ["ok", "bad\\udfff"], "sampling_params": ' + SAMPLING + '}', "text"),
    ("/generate", '{"text": "a", "sampling_params": {"stop": "x\\ud800"}}', "stop"),
    ("/generate", '{"text": "a", "sampling_params": {"stop": ["x", "\\udc00"]}}', "stop"),
    ("/generate", '{"text": "a", "rid": "bad\\ud800rid"}', "rid"),
    ("/generate", '{"text": "a", "sampling_params": {"regex": 5}}', "regex"),
    ("/v1/completions", '{"model": "@", "prompt": "a", "stop": 5}', "stop"),
    ("/v1/completions", '{"model": "@", "prompt": "bad\\ud800"}', "prompt"),
    ("/v1/chat/completions", '{"model": "@", "messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    ("/v1/completions", '{"model": "@", "prompt": 5}', "prompt"),
    ("/v1/completions", '{"model": "@", "prompt": {"text": "a"}}', "prompt"),
    ("/v1/completions", '{"model": "@", "prompt": "a", "seed": "7"}', "seed"),
    ("/v1/completions", '{"model": "@", "prompt": "a", "seed": 1.5}', "seed"),
    # An integer beyond any float: math.isfinite raises OverflowError on it.
    ("/generate", '{"text": "a", "sampling_params": {"temperature": 1' + "0" * 400 + '}}', "temperature"),
]


@pytest.mark.parametrize(("route", "content", "param"), BAD_BODIES)
def test_type_confusions_and_lone_surrogates_are_400_naming_the_field_without_a_stall(server, route, content, param):
    content = content.replace('"@"', json.dumps(model_name(server)))
    r, worst = health_latency_while(server, lambda: post(server, route, content))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == 400 and error["type"] == "invalid_request_error"
    assert worst < HEALTH_BOUND_S, f"/health took {worst:.2f}s while the bad body was refused"


def test_an_integer_temperature_beyond_64_bits_is_served_as_a_float_and_its_rid_stays_free(server):
    # JSON's 2**70 is an int; kept as one it cannot be packed into the scheduler's message.
    body = json.dumps({"text": "a", "rid": "huge-temperature", "sampling_params": {
        "temperature": 2**70, "max_new_tokens": 2, "ignore_eos": True}})
    for _ in range(2):  # the second use of the rid shows the first left nothing live behind
        r = post(server, "/generate", body)
        assert r.status_code == 200, r.text[:300]
        assert len(r.json()["output_ids"]) == 2


@pytest.mark.parametrize("route", ["/generate", "/v1/completions", "/abort_request"])
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_json_nested_100000_deep_is_400_without_a_stall(server, route, opener):
    closer = "]" if opener == "[" else "}"
    content = '{"text": ' + opener * DEEP + "1" + closer * DEEP + "}"
    r, worst = health_latency_while(server, lambda: post(server, route, content))
    assert r.status_code == 400, r.text
    assert "nested" in r.json()["error"]["message"]
    assert worst < HEALTH_BOUND_S, f"/health took {worst:.2f}s while the deep body was refused"


# -- A.3: bounded work per request ------------------------------------------------------
MAX_PROMPTS = 256  # --max-prompts-per-request's default
LONG_TEXT = "Once upon a time there was a little fox who liked to run far. " * 480  # ~30 KB


def test_a_batch_over_max_prompts_per_request_is_400_naming_the_field_before_any_work(server):
    over = MAX_PROMPTS + 1
    cases = [("/generate", {"text": ["hi"] * over}, "text"),
             ("/generate", {"input_ids": [[5, 6]] * over}, "input_ids"),
             ("/v1/completions", {"model": model_name(server), "prompt": ["hi"] * over, "max_tokens": 1}, "prompt"),
             # OpenAI's n multiplies the work: 129 prompts x 2 choices is 258 requests.
             ("/v1/completions", {"model": model_name(server), "prompt": ["hi"] * 129, "n": 2, "max_tokens": 1}, "n")]
    for route, body, param in cases:
        body = body if route != "/generate" else body | {"sampling_params": {"max_new_tokens": 1}}
        t0 = time.monotonic()
        r = post(server, route, json.dumps(body))
        assert r.status_code == 400, (route, r.text[:300])
        error = r.json()["error"]
        assert f"at most {MAX_PROMPTS} prompts" in error["message"] and "--max-prompts-per-request" in error["message"]
        assert error["param"] == param
        assert time.monotonic() - t0 < 5, "the refusal must come before the prompts are built"


def test_health_answers_while_a_max_size_batch_is_tokenized(server):
    # 256 prompts of ~30 KB (7.7 MB, under the body limit): seconds of tokenization, which must
    # not run on the event loop. Each prompt is longer than the context, so the batch is refused
    # once tokenized, and no generation is needed to prove the point.
    body = json.dumps({"text": [LONG_TEXT] * MAX_PROMPTS, "sampling_params": {"max_new_tokens": 1}})
    r, worst = health_latency_while(server, lambda: post(server, "/generate", body, timeout=120))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_new_tokens", r.text[:300]
    assert worst < HEALTH_BOUND_S, f"/health took {worst:.2f}s while the batch was tokenized"


def test_a_full_batch_of_max_prompts_is_served_and_health_stays_live(server):
    body = json.dumps({"text": [f"story {i} begins" for i in range(MAX_PROMPTS)],
                       "sampling_params": {"max_new_tokens": 1, "ignore_eos": True, "temperature": 0}})
    r, worst = health_latency_while(server, lambda: post(server, "/generate", body, timeout=300))
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()) == MAX_PROMPTS and all(len(o["output_ids"]) == 1 for o in r.json())
    assert worst < HEALTH_BOUND_S, f"/health took {worst:.2f}s while the batch ran"


def test_max_prompts_per_request_is_a_validated_server_flag():
    import argparse

    from ops.server_args import add_server_args, server_args_from
    from server.errors import ConfigError

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert server_args_from(parser.parse_args([])).max_prompts_per_request == MAX_PROMPTS
    assert server_args_from(parser.parse_args(["--max-prompts-per-request", "8"])).max_prompts_per_request == 8
    with pytest.raises(ConfigError, match="--max-prompts-per-request"):
        server_args_from(parser.parse_args(["--max-prompts-per-request", "0"]))


def test_request_builder_refuses_more_prompts_than_its_limit_before_tokenizing():
    from server.errors import InvalidRequestError
    from server.request_builder import GenerateCall, Limits, RequestBuilder

    class CountingTokenizer:
        calls = 0

        def encode(self, text: str) -> list[int]:
            CountingTokenizer.calls += 1
            return [1, 2]

    builder = RequestBuilder(CountingTokenizer(), Limits(100, 64, 64, max_prompts=3), 0)  # type: ignore[arg-type]
    assert len(builder.build(GenerateCall(prompt=["a"] * 3, sampling_params={"max_new_tokens": 1}))[0]) == 3
    CountingTokenizer.calls = 0
    with pytest.raises(InvalidRequestError, match="at most 3 prompts") as exc:
        builder.build(GenerateCall(prompt=["a"] * 4))
    assert exc.value.param == "text" and CountingTokenizer.calls == 0
    with pytest.raises(InvalidRequestError, match="at most 3 prompts") as exc:
        builder.build(GenerateCall(input_ids=[[1]] * 4))
    assert exc.value.param == "input_ids"


def test_an_unexpected_error_is_a_500_json_body_logged_without_rendering_frame_locals(capsys):
    # Rendering a traceback with every frame's locals (structlog's console default) is what held the
    # event loop for seconds; the handler must log a plain, bounded traceback instead.
    from types import SimpleNamespace

    import structlog
    from fastapi.testclient import TestClient

    from server.http.app import create_app
    from server.http.serve import configure_logging

    configure_logging("console")
    try:
        app = create_app(SimpleNamespace(args=SimpleNamespace(api_key=None, admin_api_key=None)))  # type: ignore[arg-type]

        @app.get("/boom")
        async def boom() -> None:
            hidden_local = "-".join(["LOCAL", "VALUE", "X" * 5000])  # the joined value is in no source line
            raise RuntimeError(f"kaboom {len(hidden_local)}")

        r = TestClient(app, raise_server_exceptions=False).get("/boom")
        err = capsys.readouterr().err
    finally:
        structlog.reset_defaults()
    assert r.status_code == 500 and r.json()["error"]["message"] == "internal error: RuntimeError"
    assert "unhandled_error" in err and "kaboom 5012" in err and "in boom" in err
    assert "LOCAL-VALUE-" not in err, "frame locals were rendered"
