"""JSON as answers and stream chunks carry it, encoded by orjson (~0.3 us a stream chunk against ~6
for `json.dumps`, once per token per stream). RFC 8259 has no NaN or Infinity, and strict parsers
(a browser's JSON.parse) refuse those literals: orjson writes a non-finite float as null, as SGLang's
orjson does (a grammar-masked token's top logprob is -inf). What orjson cannot encode (an integer
past 64 bits) goes through `json.dumps`, with the same rule for non-finite floats."""
from __future__ import annotations

import json
import math
from typing import Any

import orjson
from fastapi.responses import JSONResponse as _StarletteJSON


def dumps(payload: Any) -> bytes:
    """UTF-8 JSON of `payload`, compact, every NaN or infinity written as null."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return json.dumps(_finite(payload), allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class JSONResponse(_StarletteJSON):
    def render(self, content: Any) -> bytes:
        return dumps(content)
