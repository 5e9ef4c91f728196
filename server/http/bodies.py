"""Reading and checking JSON bodies: size limit, JSON object, known fields, field types."""
from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request

from server.api_fields import Surface
from server.errors import InvalidRequestError
from server.http.errors import HttpError

MAX_BODY_BYTES = 8 << 20


async def json_object(request: Request, allowed: Surface | frozenset[str]) -> dict[str, Any]:
    """The body as a JSON object whose fields `allowed` knows (a Surface also checks neutral values)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HttpError(413, f"the body is larger than {MAX_BODY_BYTES} bytes", "request_too_large")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise HttpError(413, f"the body is larger than {MAX_BODY_BYTES} bytes", "request_too_large")
    body = parse_json(bytes(raw))
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object")
    if isinstance(allowed, Surface):
        allowed.check(body)
        return body
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequestError(f"unsupported field {unknown[0]!r}", unknown[0])
    return body


def parse_json(raw: bytes) -> Any:
    """The body's JSON value; every way it can be bad is a 400, never a 500 with a traceback."""
    try:
        # Decoded strictly, not as json.loads(bytes) does (surrogatepass): a lone surrogate sent as raw
        # bytes is not UTF-8, and would pass the escape check below to fail the tokenizer or the log.
        text = raw.decode(json.detect_encoding(raw))
        value = json.loads(text)
    except RecursionError:
        # The decoder recurses per level; a body nested beyond the interpreter's limit is a client's
        # mistake (or an attack), not a server error.
        raise InvalidRequestError("the body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"the body is not valid JSON: {exc}") from None
    if _MAYBE_SURROGATE.search(text) is not None:
        _refuse_lone_surrogates(value)
    return value


# Strictly decoded text can only smuggle a lone surrogate in as an escape, so a body without such an
# escape needs no walk. Searched in the text, not the bytes: a UTF-16 body spells the escape differently.
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def _refuse_lone_surrogates(value: Any) -> None:
    """A lone surrogate cannot be tokenized, logged or echoed: refused here, naming its field."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # C speed; valid pairs pass
        return
    except UnicodeEncodeError:
        pass
    except RecursionError:
        raise InvalidRequestError("the body is nested too deeply") from None
    field = _surrogate_field(value)
    raise InvalidRequestError(f"{field or 'the body'} must be valid Unicode text (it contains a lone surrogate)",
                              field)


def _surrogate_field(value: Any) -> str | None:
    """The field holding the bad string: the innermost key reached through objects only, so
    `sampling_params.stop` names `stop` and `messages[0].content` names `messages` (iterative: any depth)."""
    stack: list[tuple[Any, str | None, bool]] = [(value, None, True)]
    while stack:
        item, field, via_objects = stack.pop()
        if isinstance(item, str):
            if not _encodes(item):
                return field
        elif isinstance(item, dict):
            for key, child in item.items():
                if not _encodes(key):
                    return field
                stack.append((child, key if via_objects else field, via_objects))
        elif isinstance(item, list):
            stack.extend((child, field, False) for child in item)
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
