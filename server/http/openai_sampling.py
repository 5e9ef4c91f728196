"""Sampling controls the OpenAI routes accept beyond OpenAI's core ones (the extras SGLang and vLLM
take on these routes), mapped to `SamplingParams` names. Values are checked once, by
`SamplingParams.from_dict`, so a bad one is a 400 naming its field on every route alike."""
from __future__ import annotations

from typing import Any

from server.errors import InvalidRequestError

# OpenAI/vLLM spelling -> SamplingParams spelling.
RENAMED = {"min_tokens": "min_new_tokens"}
PASSED = ("frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "stop_token_ids",
          "no_stop_trim", "skip_special_tokens", "spaces_between_special_tokens", "regex", "ebnf", "json_schema")
SAMPLING_FIELDS = frozenset(RENAMED) | frozenset(PASSED)


def sampling_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The body's sampling controls under SamplingParams names (absent and null fields left out)."""
    out = {name: body[name] for name in PASSED if body.get(name) is not None}
    out.update({ours: body[theirs] for theirs, ours in RENAMED.items() if body.get(theirs) is not None})
    return out


def as_sent(exc: InvalidRequestError) -> InvalidRequestError:
    """The same error naming the field as the client spelled it (min_tokens, not min_new_tokens)."""
    back = {ours: theirs for theirs, ours in RENAMED.items()} | {"max_new_tokens": "max_tokens"}
    if exc.param not in back:
        return exc
    message = str(exc)
    for ours, theirs in back.items():
        message = message.replace(ours, theirs)
    return InvalidRequestError(message, back[exc.param])
