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
# SGLang's other name for `seed`; folded into `seed` at the boundary so nothing downstream sees two.
SEED_ALIAS = "sampling_seed"
MAX_ABS_PENALTY = 2.0  # OpenAI's range for frequency/presence penalties
MAX_ABS_LOGIT_BIAS = 100.0  # OpenAI's range for one logit_bias value


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
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False  # keep a matched stop string (or stop token's text) in the output text
    # EOS and stop_token_ids are masked until this many tokens are out (stop strings wait too).
    min_new_tokens: int = 0
    # Penalties as HF/vLLM define them: repetition over prompt+output, frequency/presence over output.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), sorted by id
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
    def has_penalties(self) -> bool:
        """Does sampling read the request's committed token counts (state a result mutates)?"""
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def adjusts_logits(self) -> bool:
        """Does anything change this request's logits before sampling (false: the zero-cost path)?"""
        return self.has_penalties or bool(self.logit_bias) or self.min_new_tokens > 0

    @property
    def grammar(self) -> GrammarSpec | None:
        return spec_from_fields(self.json_schema, self.regex, self.ebnf)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> SamplingParams:
        if raw is not None and not isinstance(raw, dict):
            raise InvalidRequestError("sampling_params must be an object", "sampling_params")
        raw = dict(raw or {})
        SAMPLING.check(raw)  # unknown names, and SGLang's fields we take only at their neutral value
        raw = _fold_seed_alias(raw)
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known and v is not None}
        values["stop"] = _as_tuple(values.get("stop", ()), "stop", str)
        values["stop_token_ids"] = _as_tuple(values.get("stop_token_ids", ()), "stop_token_ids", int)
        if isinstance(values.get("json_schema"), (dict, bool)):  # a schema given as an object
            values["json_schema"] = json.dumps(values["json_schema"])
        if "logit_bias" in values:
            values["logit_bias"] = _logit_bias(values["logit_bias"])
        for name in ("temperature", "top_p", "min_p", *_PENALTIES):  # JSON's 2**70 is an int: a float from here on
            if name in values:
                values[name] = _as_float(name, values[name])
        params = cls(**values)
        params.validate()
        return params

    @classmethod
    def from_wire(cls, fields_: dict[str, Any]) -> SamplingParams:
        """Rebuilds validated params from `to_dict()` after msgpack turned its tuples into lists."""
        tuples = {"stop": tuple(fields_["stop"]), "stop_token_ids": tuple(fields_["stop_token_ids"]),
                  "logit_bias": tuple((int(t), float(b)) for t, b in fields_.get("logit_bias", ()))}
        return cls(**{**fields_, **tuples})

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
        for flag in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidRequestError(f"{flag} must be a boolean", flag)
        self._validate_controls()
        spec = self.grammar
        if spec is not None:
            check_syntax(spec)


    def _validate_controls(self) -> None:
        _check_int("min_new_tokens", self.min_new_tokens, 0, MAX_NEW_TOKENS_LIMIT)
        if self.min_new_tokens > self.max_new_tokens:
            raise InvalidRequestError(f"min_new_tokens ({self.min_new_tokens}) must not exceed max_new_tokens "
                                      f"({self.max_new_tokens})", "min_new_tokens")
        for name in ("frequency_penalty", "presence_penalty"):
            _check_float(name, getattr(self, name))
            if abs(getattr(self, name)) > MAX_ABS_PENALTY:
                raise InvalidRequestError(f"{name} must be in [-2, 2]", name)
        _check_float("repetition_penalty", self.repetition_penalty)
        if not 0 < self.repetition_penalty <= MAX_ABS_PENALTY:
            raise InvalidRequestError("repetition_penalty must be in (0, 2]", "repetition_penalty")
        for token, bias in self.logit_bias:
            _check_int("logit_bias", token, 0, (1 << 31) - 1)
            _check_float("logit_bias", bias)
            if abs(bias) > MAX_ABS_LOGIT_BIAS:
                raise InvalidRequestError(f"logit_bias values must be in [-100, 100], got {bias}", "logit_bias")


_PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")


def _fold_seed_alias(raw: dict[str, Any]) -> dict[str, Any]:
    """`sampling_seed` is `seed` under SGLang's other name; both at different values is ambiguous."""
    alias = raw.pop(SEED_ALIAS, None)
    if alias is None:
        return raw
    if raw.get("seed") is not None and raw["seed"] != alias:
        raise InvalidRequestError("give seed or sampling_seed, not both with different values", SEED_ALIAS)
    raw["seed"] = alias
    return raw


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token id (a JSON key, so a string of digits) to bias, as sorted pairs."""
    if not isinstance(value, dict):
        raise InvalidRequestError("logit_bias must be an object mapping token ids to numbers", "logit_bias")
    pairs: list[tuple[int, float]] = []
    for key, bias in value.items():
        text = str(key)
        if not (isinstance(key, int) and not isinstance(key, bool)) and not (text.isascii() and text.isdigit()):
            raise InvalidRequestError(f"logit_bias keys must be token ids, got {key!r}", "logit_bias")
        pairs.append((int(text), _as_float("logit_bias", bias)))
    return tuple(sorted(pairs))


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
