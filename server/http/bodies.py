"""Reading and checking JSON bodies: size limit, JSON object, known fields, field types."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from server.errors import InvalidRequestError
from server.http.errors import HttpError

MAX_BODY_BYTES = 8 << 20


async def json_object(request: Request, allowed: frozenset[str]) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HttpError(413, f"the body is larger than {MAX_BODY_BYTES} bytes", "request_too_large")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise HttpError(413, f"the body is larger than {MAX_BODY_BYTES} bytes", "request_too_large")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequestError(f"unsupported field {unknown[0]!r}", unknown[0])
    return body


def typed(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """The field's value if present (None counts as absent), checked against `kind`."""
    value = body.get(name)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidRequestError(f"{name} must be {_names(kinds)}", name)
    if not isinstance(value, kinds):
        raise InvalidRequestError(f"{name} must be {_names(kinds)}", name)
    return value


def _names(kinds: tuple[type, ...]) -> str:
    words = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object"}
    return " or ".join(words.get(k, k.__name__) for k in kinds)
