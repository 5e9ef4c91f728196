"""Hypothesis fuzz over every HTTP route (issue 10, "Keep the classes covered").

Valid bodies for each POST route with fields made hostile (type confusions, lone surrogates as
escapes and as raw bytes, deep nesting, huge and empty values, NaN and Infinity literals, unknown
and missing fields), bodies no JSON encoder writes (empty, truncated, not UTF-8, over the size
limit, chunked), and hostile paths, methods and query strings. Every answer is a 2xx whose JSON
body or SSE stream is well formed, or a 4xx whose JSON body is the OpenAI error object naming a
field the route knows or the body holds; /health answers within a bound while each request runs;
and afterwards the server still serves, stops cleanly and its log verifies. One server for the
file, with a small context so that any body it accepts finishes fast.
"""
from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from server_process import ServerProcess

from server.api_fields import SAMPLING
from server.http.native import GENERATE_FIELDS
from server.http.openai_api import CHAT_FIELDS, COMPLETION_FIELDS

ROOT = Path(__file__).resolve().parents[2]
MODEL = "fuzz-tiny"
# A liveness bound, not a speed benchmark: thousands of polls on a shared 2-core machine see 1 s of
# noise now and then, while a stalled event loop (a parse or walk on it) holds /health for seconds.
HEALTH_BOUND_S = 2.0
REQUEST_TIMEOUT_S = 60
QUICK = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
QUICK_BODIES = settings(QUICK, max_examples=40)  # the widest space: a route's every field times every value kind
QUICK_RAW = settings(QUICK, max_examples=15)  # a small, finite space
SLOW = settings(QUICK, max_examples=400)
SAMPLING_NAMES = SAMPLING.names  # implemented, neutral-only and refused: every name the contract knows
# The fields an error may name: a route's own, and the sampling parameters the OpenAI fields map to.
KNOWN_PARAMS = GENERATE_FIELDS | COMPLETION_FIELDS | CHAT_FIELDS | SAMPLING_NAMES | {"abort_all"}


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tiny_checkpoint("llama"), tmp_path_factory.mktemp("fuzz") / "log",
                         "--context-length", "128", "--served-model-name", MODEL,
                         "--log-requests", "--log-requests-level", "3", "--log-format", "json")
    proc.wait_healthy()
    _wait_for_a_durable_record(proc)
    yield proc
    assert proc.proc.poll() is None, f"the server died during the fuzz: {proc.stderr()[-4000:]}"
    assert proc.terminate() == 0, proc.stderr()[-4000:]
    assert_log_verifies(proc.log_dir)


def assert_log_verifies(log_dir: Path) -> None:
    ran = subprocess.run([sys.executable, "-m", "ops.cli", "verify", "--log-dir", str(log_dir)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def _wait_for_a_durable_record(proc: ServerProcess) -> None:
    """One request first, so that /log/head has a head to show (it answers 503 on an empty log)."""
    body = {"text": "warm up", "sampling_params": {"max_new_tokens": 1}}
    assert httpx.post(f"{proc.url}/generate", json=body, timeout=REQUEST_TIMEOUT_S).status_code == 200
    deadline = time.monotonic() + 30
    while httpx.get(f"{proc.url}/log/head").status_code != 200:
        assert time.monotonic() < deadline, "the log's head never became readable"
        time.sleep(0.1)


# -- bodies ----------------------------------------------------------------------------
class Raw:
    """Bytes spliced in where a JSON value goes: what no encoder writes."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:40]!r}{'...' if len(self.text) > 40 else ''} {len(self.text)} bytes)"


def encode(tree: Any) -> bytes:
    """The body's bytes. ensure_ascii, so a lone surrogate goes out as a `\\ud800` escape (httpx's
    encoder refuses one); floats NaN and inf as the NaN and Infinity literals Python's decoder takes."""
    raws: list[bytes] = []

    def splice(value: object) -> str:
        if not isinstance(value, Raw):
            raise TypeError(type(value).__name__)
        raws.append(value.text)
        return f"\x00raw{len(raws) - 1}\x00"

    out = json.dumps(tree, default=splice).encode()
    for i, raw in enumerate(raws):
        out = out.replace(f'"\\u0000raw{i}\\u0000"'.encode(), raw, 1)
    return out


def deep(opener: bytes, closer: bytes, depth: int) -> Raw:
    return Raw(opener * depth + b"1" + closer * depth)


def deep_schema(depth: int) -> Raw:
    return Raw(b'{"type": "array", "items": ' * depth + b'{"type": "string"}' + b"}" * depth)


RAW_VALUES = [
    Raw(b"NaN"), Raw(b"-Infinity"), Raw(b"1e999"), Raw(b"-0"), Raw(b"1.0e-400"),
    Raw(b"1" * 5000),  # beyond the interpreter's int-from-string digit limit
    Raw(b'"\xed\xa0\x80"'),  # a lone surrogate as raw (CESU-8) bytes, not as an escape
    Raw(b'"\xed\xb0\x80 tail"'),
    Raw(b'"\xff\xfe"'),  # not UTF-8 at all
    Raw(b'"\\u0000"'), Raw(b'"\\ud83d\\ude00"'),  # NUL; a valid surrogate pair
    deep(b"[", b"]", 100_000), deep(b'{"a":', b"}", 100_000), deep(b"[", b"]", 900), deep(b'{"a":', b"}", 900),
    deep_schema(300),
]
LONE_SURROGATE = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
SURROGATE_TEXT = st.tuples(st.text(max_size=3), LONE_SURROGATE, st.text(max_size=3)).map("".join)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3),
    st.sampled_from([2**31, 2**63, -(2**63) - 1, 2**70, 10**40]),
    st.floats(), st.sampled_from([-0.0, 0.5, 1e308, -1e308, 5e-324]),
    st.text(max_size=6), st.just(""), SURROGATE_TEXT,
)
HUGE = st.sampled_from([Raw(b'"' + b"x" * 200_000 + b'"'), Raw(b"[" + b"7," * 50_000 + b"7]"),
                        Raw(b"[" + b'"s",' * 20_000 + b'"s"]'), Raw(b"{" + b",".join(b'"k%d": 1' % i for i in range(20_000))
                                                                    + b"}")])
GRAMMARS = st.sampled_from(["[a-z]+", "(", "\\", "a{3}", 'root ::= "a"', "root ::=", '{"type": "object"}', "{",
                            '{"type": 5}', "[]", "null", {"type": "string"}, {"type": "object", "properties": 5},
                            {"$ref": "#/nowhere"}, True, deep_schema(40)])
MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", ""]),
     "content": st.one_of(st.text(max_size=6), SCALARS, st.lists(st.fixed_dictionaries(
         {"type": st.sampled_from(["text", "image_url"]), "text": SCALARS}), max_size=2))}), max_size=3)
PLAUSIBLE = st.one_of(
    st.lists(st.integers(-2, 520), max_size=6),  # token ids, some outside the vocabulary
    st.lists(st.lists(st.integers(0, 511), max_size=3), max_size=3),
    st.lists(st.text(max_size=4), max_size=3), st.lists(SURROGATE_TEXT, min_size=1, max_size=2),
    GRAMMARS, MESSAGES,
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])},
                          optional={"json_schema": st.fixed_dictionaries({"schema": GRAMMARS})}),
)
HOSTILE = st.one_of(
    SCALARS, PLAUSIBLE, st.sampled_from(RAW_VALUES), HUGE, st.just([]), st.just({}),
    st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=6),
)

# Odd but valid values, so that bodies also get past the checks into the scheduler and the log.
EDGE = {
    "max_new_tokens": [0, 1, 4], "max_tokens": [0, 1, 4], "max_completion_tokens": [0, 1, 4],
    "temperature": [0, 1e-7, 2.0, 1e308, 2**70], "top_p": [1e-9, 0.5, 1], "top_k": [-1, 1, 511, 512, 2**31], "min_p": [0, 1],
    "seed": [0, -(2**63), 2**63 - 1], "n": [1, 2, 16], "stop": ["a", [" ", "\n"], ["\ud83d\ude00"], ["x" * 1000]],
    "stop_token_ids": [[], [0], [511], [0, 1, 2, 3]], "ignore_eos": [True], "skip_special_tokens": [False],
    "top_logprobs_num": [0, 1, 512], "logprob_start_len": [-1, 0, 2], "return_logprob": [True],
    "return_hidden_states": [True], "stream": [True, False], "logprobs": [0, 20, True], "top_logprobs": [0, 20],
    "regex": ["[a-z]+", "a|b", ".{0,3}"], "json_schema": ['{"type": "string"}', {"type": "integer"}],
    "ebnf": ['root ::= "a" | "b"'], "rid": ["fz-edge", "a/b", "\u00e9" * 128], "input_ids": [[0], [511], list(range(100))],
    "text": [" ", "\u00e9", "\ud83d\ude00", "<s>", ["x"] * 3], "prompt": [" ", [[5], [6, 7]], ["a"] * 3],
    "messages": [[{"role": "user", "content": ""}], [{"role": "user", "content": [{"type": "text", "text": "t"}]}]],
    "response_format": [{"type": "json_object"}, {"type": "text"}], "stream_options": [{"include_usage": True}, {}],
    "abort_all": [False], "echo": [False, True], "user": ["u"], "frequency_penalty": [0, -2, 2], "best_of": [1],
    "presence_penalty": [-2, 0.5, 2], "repetition_penalty": [1e-9, 1, 2], "min_new_tokens": [0, 1, 2], "min_tokens": [0, 1],
    "logit_bias": [{}, {"0": 100}, {"511": -100, "5": 1e-9}], "no_stop_trim": [True],
    "spaces_between_special_tokens": [False], "sampling_seed": [0, 2**63 - 1],
}
SMALL = {"max_new_tokens": 2, "temperature": 0}
VALID = {
    "/generate": [
        {"text": "Once upon a time", "sampling_params": SMALL},
        {"input_ids": [5, 6, 7], "sampling_params": SMALL | {"stop": ["x"], "top_k": 3}, "return_logprob": True,
         "top_logprobs_num": 2},
        {"text": ["a", "b"], "sampling_params": [SMALL, SMALL | {"seed": 1}], "rid": ["fz-a", "fz-b"]},
        {"text": "streamed", "sampling_params": SMALL | {"regex": "[a-z]+"}, "stream": True, "rid": "fz-s"},
    ],
    "/v1/completions": [
        {"model": MODEL, "prompt": "Once", "max_tokens": 2, "temperature": 0},
        {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2, "n": 2, "seed": 4, "logprobs": 1, "stop": "x"},
        {"model": MODEL, "prompt": [5, 6], "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}},
    ],
    "/v1/chat/completions": [
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
         "max_completion_tokens": 2},
        {"model": MODEL, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
         "max_completion_tokens": 2, "logprobs": True, "top_logprobs": 2, "stream": True,
         "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}},
    ],
    "/abort_request": [{"rid": "fz-nobody"}, {"rid": "fz-a"}, {"abort_all": True}],
}
POST_ROUTES = list(VALID)


def paths_of(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a valid body a value sits (dict keys and list indexes)."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else []
    out = []
    for key, child in items:
        out.append((*prefix, key))
        out.extend(paths_of(child, (*prefix, key)))
    return out


def route_fields(route: str) -> list[tuple[Any, ...]]:
    """Fields the route knows, present in a valid body or not, so each one gets fuzzed."""
    names = {"/generate": GENERATE_FIELDS, "/v1/completions": COMPLETION_FIELDS,
             "/v1/chat/completions": CHAT_FIELDS, "/abort_request": {"rid", "abort_all"}}[route]
    extra = [("sampling_params", name) for name in sorted(SAMPLING_NAMES)] if route == "/generate" else []
    return [(name,) for name in sorted(names)] + extra


def set_at(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of `tree` with `value` at `path`."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, head: set_at(tree.get(head, {}), rest, value)}
    if isinstance(tree, list) and isinstance(head, int) and head < len(tree):
        return [set_at(v, rest, value) if i == head else v for i, v in enumerate(tree)]
    return {head: set_at({}, rest, value)}  # the path ran into a scalar: replace it with an object


def drop_at(tree: Any, path: tuple[Any, ...]) -> Any:
    head, rest = path[0], path[1:]
    if isinstance(tree, dict) and head in tree:
        return {k: v for k, v in tree.items() if k != head} if not rest else {**tree, head: drop_at(tree[head], rest)}
    if isinstance(tree, list) and isinstance(head, int) and head < len(tree):
        return [v for i, v in enumerate(tree) if i != head] if not rest else [
            drop_at(v, rest) if i == head else v for i, v in enumerate(tree)]
    return tree


@st.composite
def mutated_body(draw: st.DrawFn, route: str) -> Any:
    """A valid body for `route` with one to three of: a field made hostile, a field dropped, an
    unknown field added (at the top or inside sampling_params), or the whole body replaced."""
    tree = draw(st.sampled_from(VALID[route]))
    for _ in range(draw(st.sampled_from([1, 1, 2, 3]))):
        kind = draw(st.sampled_from(["set"] * 6 + ["drop", "unknown", "whole"]))
        places = paths_of(tree) + route_fields(route)
        if kind == "set":
            path = draw(st.sampled_from(places))
            # Drawn apart: one_of would flatten HOSTILE's branches and all but drown the edge values.
            edgy = path[-1] in EDGE and draw(st.booleans())
            tree = set_at(tree, path, draw(st.sampled_from(EDGE[path[-1]]) if edgy else HOSTILE))
        elif kind == "drop" and paths_of(tree):
            tree = drop_at(tree, draw(st.sampled_from(paths_of(tree))))
        elif kind == "unknown":
            parent = draw(st.sampled_from([(), ("sampling_params",)]))
            name = draw(st.one_of(st.text(max_size=8), SURROGATE_TEXT, st.sampled_from(["__proto__", "n", "Text"])))
            tree = set_at(tree, (*parent, name), draw(HOSTILE)) if isinstance(tree, dict) else tree
        elif kind == "whole":
            tree = draw(HOSTILE)
    return tree


RAW_BODIES = st.sampled_from([
    b"", b" ", b"null", b"[]", b"123", b'"text"', b"{", b'{"text": }', b"{'text': 'a'}", b'{"text": "a",}',
    b"\xff\xfe\x00\x00", b"\xef\xbb\xbf{}", '{"text": "a"}'.encode("utf-16"), b'{"text": "a"}\x00', b"NaN",
    b'{"text": "a"} {"text": "b"}', b'{"text": "a", "text": 5}', b'{"\xed\xa0\x80": 1}',
    '{"\\ud800": 1}'.encode("utf-16"),  # a lone surrogate's escape, spelled in UTF-16
    b'{"text": "' + b"a" * (9 << 20) + b'"}',  # over the 8 MiB body limit
])
CONTENT_TYPES = st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=x", "application/json; charset=latin-1", None])


# -- one exchange ----------------------------------------------------------------------
@dataclass
class Answer:
    status: int
    content_type: str
    raw: bytes


def send(server: ServerProcess, method: str, path: str, body: bytes | None, content_type: str | None,
         chunked: bool = False) -> Answer:
    headers = {"content-type": content_type} if content_type else {}
    content: Any = body
    if chunked and body is not None:  # no content-length: the size limit must hold while reading
        content = iter([body[i:i + (1 << 16)] for i in range(0, len(body), 1 << 16)])
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, follow_redirects=True) as client:
        with client.stream(method, f"{server.url}{path}", content=content, headers=headers) as r:
            return Answer(r.status_code, r.headers.get("content-type", ""), r.read())


def exchange(server: ServerProcess, method: str, path: str, body: bytes | None = None,
             content_type: str | None = "application/json", chunked: bool = False) -> Answer:
    """Sends one request while polling /health; the answer, once /health kept within its bound."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool, httpx.Client(timeout=30) as health:
        future = pool.submit(send, server, method, path, body, content_type, chunked)
        worst = 0.0
        while True:
            done = future.done()
            t0 = time.monotonic()
            status = health.get(f"{server.url}/health").status_code
            worst = max(worst, time.monotonic() - t0)
            assert status == 200, f"/health answered {status}"
            if done:
                break
            time.sleep(0.02)
        answer = future.result()
    assert worst < HEALTH_BOUND_S, f"/health took {worst:.2f}s while {method} {path} ran"
    assert server.proc.poll() is None, f"the server died: {server.stderr()[-4000:]}"
    return answer


def strict_json(raw: bytes) -> Any:
    """RFC 8259 JSON: NaN and Infinity, which Python's decoder takes, are refused (as JSON.parse does)."""
    def refuse(literal: str) -> None:
        raise AssertionError(f"{literal} is not JSON: {raw[:300]!r}")

    return json.loads(raw, parse_constant=refuse)


def check_answer(path: str, answer: Answer, body: bytes | None = None) -> None:
    """2xx with a well-formed body, or 4xx with the OpenAI error object naming a real field."""
    shown = answer.raw[:300]
    event(f"HTTP {answer.status}")
    assert 200 <= answer.status < 300 or 400 <= answer.status < 500, (answer.status, shown)
    if answer.status >= 400:
        assert answer.content_type.startswith("application/json"), (answer.status, answer.content_type, shown)
        error = strict_json(answer.raw)["error"]
        assert isinstance(error["message"], str) and error["message"], shown
        assert isinstance(error["type"], str) and error["code"] == answer.status, shown
        param = error["param"]
        event(f"error names {param}")
        # A 400 either names its field or is about the body as a whole.
        assert param is not None or answer.status != 400 or error["message"].startswith("the body"), shown
        named = param is None or param in KNOWN_PARAMS or json.dumps(param).encode() in (body or b"")
        assert named, f"the error names {param!r}, a field neither the route nor the body has: {shown!r}"
    elif answer.content_type.startswith("text/event-stream"):
        check_stream(path, answer.raw)
    elif answer.content_type.startswith("application/json"):
        strict_json(answer.raw)


def check_stream(path: str, raw: bytes) -> None:
    """Events are `data: <json>`, the last one `data: [DONE]`, and every choice finished before it."""
    events = [e for e in raw.split(b"\n\n") if e]
    assert events and all(e.startswith(b"data: ") for e in events), raw[-300:]
    assert events[-1] == b"data: [DONE]", raw[-300:]
    chunks = [strict_json(e[len(b"data: "):]) for e in events[:-1]]
    if path == "/generate":
        assert chunks and chunks[-1]["meta_info"]["finish_reason"] is not None, raw[-300:]
        return
    choices = [c for chunk in chunks for c in chunk["choices"]]
    assert choices and {c["index"] for c in choices} == {c["index"] for c in choices if c["finish_reason"]}, \
        raw[-300:]


# Python's decoder also takes JSON in UTF-16 and UTF-32 (found by a byte-order mark or NUL pattern),
# where a surrogate's escape is spelled in other bytes than in UTF-8.
ENCODINGS = st.sampled_from(["utf-8", "utf-8", "utf-16", "utf-32"])


def check_body(server: ServerProcess, route: str, data: st.DataObject) -> None:
    body = encode(data.draw(mutated_body(route), label="body"))
    encoding = data.draw(ENCODINGS, label="encoding")
    sent = body.decode("ascii").encode(encoding) if body.isascii() else body
    check_answer(route, exchange(server, "POST", route, sent), body)


# -- hostile paths and methods ---------------------------------------------------------
RID_TEXT = st.one_of(st.text(max_size=12), SURROGATE_TEXT, st.text(min_size=300, max_size=400),
                     st.sampled_from(["", "/", "..", "%", "a/b", "fz-a", "x" * 5000, "%ff", "\x00"]))
QUERIES = st.one_of(st.just(""), st.text(max_size=12).map(lambda q: "?" + urllib.parse.quote(q, safe="=&")))
GET_PATHS = st.one_of(
    RID_TEXT.map(lambda rid: "/requests/" + urllib.parse.quote(rid, safe="/", errors="surrogatepass")),
    st.sampled_from(["/health", "/metrics", "/v1/models", "/log/head", "/requests", "/requests/", "/nowhere",
                     "/v1/completions/x", "/generate/", "//generate", "/v1"]),
)
METHODS = st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "DELETE", "PATCH"])


def check_path(server: ServerProcess, method: str, path: str) -> None:
    check_answer(path, exchange(server, method, path, b"{}" if method != "GET" else None))


# -- the tests -------------------------------------------------------------------------
@pytest.mark.parametrize("route", POST_ROUTES)
@QUICK_BODIES
@given(data=st.data())
def test_hostile_json_bodies_answer_2xx_or_a_json_4xx_naming_the_field_and_never_stall_health(server, route, data):
    check_body(server, route, data)


@pytest.mark.parametrize("route", POST_ROUTES)
@QUICK_RAW
@given(body=RAW_BODIES, content_type=CONTENT_TYPES, chunked=st.booleans())
def test_bodies_no_json_encoder_writes_answer_a_json_4xx_and_never_stall_health(server, route, body, content_type,
                                                                                chunked):
    check_answer(route, exchange(server, "POST", route, body, content_type, chunked), body)


@QUICK
@given(method=METHODS, path=GET_PATHS, query=QUERIES)
def test_hostile_paths_methods_and_queries_answer_2xx_or_a_json_4xx(server, method, path, query):
    check_path(server, method, path + query)


FUZZ_RIDS = ["fz-a", "fz-b", "fz-s", *EDGE["rid"]]


def test_after_the_fuzz_the_server_still_serves_every_rid_it_used_and_its_live_log_verifies(server):
    # No body, refused or served, leaves its rid live: each one is free for a new request.
    for rid in FUZZ_RIDS:
        r = httpx.post(f"{server.url}/generate", json={"text": "after", "rid": rid, "sampling_params": SMALL},
                       timeout=REQUEST_TIMEOUT_S)
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 2, (rid, r.text[:300])
    assert_log_verifies(server.log_dir)


@pytest.mark.slow
@pytest.mark.parametrize("route", POST_ROUTES)
@SLOW
@given(data=st.data())
def test_hostile_json_bodies_many_examples(server, route, data):
    check_body(server, route, data)


@pytest.mark.slow
@pytest.mark.parametrize("route", POST_ROUTES)
@SLOW
@given(body=RAW_BODIES, content_type=CONTENT_TYPES, chunked=st.booleans())
def test_bodies_no_json_encoder_writes_many_examples(server, route, body, content_type, chunked):
    check_answer(route, exchange(server, "POST", route, body, content_type, chunked), body)


@pytest.mark.slow
@SLOW
@given(method=METHODS, path=GET_PATHS, query=QUERIES)
def test_hostile_paths_many_examples(server, method, path, query):
    check_path(server, method, path + query)
