"""The front's JSON: strict RFC 8259 output (no NaN or Infinity literals), whatever the payload."""
from __future__ import annotations

import json

import pytest

from server.http.json_wire import dumps
from server.http.streams import sse


def _strict(raw: bytes) -> object:
    def refuse(literal: str) -> None:
        raise AssertionError(f"{literal} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def test_non_finite_floats_are_written_as_null_at_any_depth():
    payload = {"top": [[3, float("-inf")], [4, -0.5]], "nan": float("nan"), "inner": {"x": (float("inf"),)}}
    assert _strict(dumps(payload)) == {"top": [[3, None], [4, -0.5]], "nan": None, "inner": {"x": [None]}}


@pytest.mark.parametrize("payload", [{"id": 2**70, "lp": float("nan")}, {"ok": "caf\u00e9", "n": -(2**65)}])
def test_what_the_fast_encoder_refuses_is_still_written_and_strict(payload):
    # Integers past 64 bits are refused by orjson: the fallback writes them, non-finite floats still null.
    got = _strict(dumps(payload))
    assert got == {k: (None if isinstance(v, float) else v) for k, v in payload.items()}


def test_a_stream_chunk_is_one_sse_event():
    raw = sse({"text": "a\nb"})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n\n") == 1
    assert _strict(raw[len(b"data: "):-2]) == {"text": "a\nb"}
