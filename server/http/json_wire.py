"""JSON as answers and stream chunks carry it. RFC 8259 has no NaN or Infinity, and strict parsers
(a browser's JSON.parse) refuse those literals, so a non-finite float is written as null, as SGLang's
orjson writes it: a grammar-masked token's top logprob is -inf."""
from __future__ import annotations

import json
import math
from typing import Any

from fastapi.responses import JSONResponse as _StarletteJSON


def dumps(payload: Any, **kwargs: Any) -> str:
    """`json.dumps`, with every NaN or infinity written as null (the walk runs only when one is there)."""
    try:
        return json.dumps(payload, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(_finite(payload), allow_nan=False, **kwargs)


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
        return dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
