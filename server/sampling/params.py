"""Per-request sampling parameters with SGLang's names, validated at the boundary."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any

from server.api_fields import SAMPLING
from server.errors import InvalidRequestError
from server.grammar.spec import GrammarSpec, check_syntax, spec_from_fields

MAX_NEW_TOKENS_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    # Structured output (at most one): a JSON schema as a string, a regex, or an EBNF grammar.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1

    @property
    def grammar(self) -> GrammarSpec | None:
        return spec_from_fields(self.json_schema, self.regex, self.ebnf)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> SamplingParams:
        if raw is not None and not isinstance(raw, dict):
            raise InvalidRequestError("sampling_params must be an object", "sampling_params")
        raw = dict(raw or {})
        SAMPLING.check(raw)  # unknown names, and SGLang's fields we take only at their neutral value
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known and v is not None}
        values["stop"] = _as_tuple(values.get("stop", ()), "stop", str)
        values["stop_token_ids"] = _as_tuple(values.get("stop_token_ids", ()), "stop_token_ids", int)
        if isinstance(values.get("json_schema"), (dict, bool)):  # a schema given as an object
            values["json_schema"] = json.dumps(values["json_schema"])
        for name in ("temperature", "top_p", "min_p"):  # JSON's 2**70 is an int: a float from here on
            if name in values:
                values[name] = _as_float(name, values[name])
        params = cls(**values)
        params.validate()
        return params

    def validate(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 0, MAX_NEW_TOKENS_LIMIT)
        _check_float("temperature", self.temperature)
        if self.temperature < 0:
            raise InvalidRequestError("temperature must be >= 0", "temperature")
        _check_float("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p must be in (0, 1]", "top_p")
        _check_int("top_k", self.top_k, -1, 1 << 31)
        if self.top_k == 0:
            raise InvalidRequestError("top_k must be -1 (disabled) or >= 1", "top_k")
        _check_float("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise InvalidRequestError("min_p must be in [0, 1]", "min_p")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequestError("stop must be a non-empty string or a list of them", "stop")
        for s in self.stop:
            check_unicode("stop", s)
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, 1 << 31)
        if self.seed is not None:
            _check_int("seed", self.seed, -(1 << 63), (1 << 63) - 1)
        for flag in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidRequestError(f"{flag} must be a boolean", flag)
        spec = self.grammar
        if spec is not None:
            check_syntax(spec)


def check_unicode(name: str, text: str) -> None:
    """Refuses a string the tokenizer and the log cannot encode (a lone surrogate from JSON's \\udXXX)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"{name} must be valid Unicode text (it contains a lone surrogate)", name) from None


def _as_tuple(value: object, name: str, item: type) -> tuple[Any, ...]:
    """One item or a list of them, as a tuple; anything else is a 400 naming the field (not a TypeError)."""
    if isinstance(value, item) and item is str:
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    noun = "a string or a list of strings" if item is str else "a list of integers"
    raise InvalidRequestError(f"{name} must be {noun}", name)


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer", name)
    if not lo <= value <= hi:
        raise InvalidRequestError(f"{name} must be between {lo} and {hi}, got {value}", name)


def _as_float(name: str, value: object) -> float:
    _check_float(name, value)
    return float(value)  # type: ignore[arg-type]


def _check_float(name: str, value: object) -> None:
    try:
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an int beyond any float
        finite = False
    if not finite:
        raise InvalidRequestError(f"{name} must be a finite number", name)
