"""What a request is constrained to (`GrammarSpec`), taken from its sampling params, and the
cheap syntax check the front runs so that a bad constraint is a 400 before any forward.

Torch-free at import: xgrammar (which imports torch) is loaded only when a request carries
a constraint, so the front's start-up stays light.
"""
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass

from server.errors import InvalidRequestError

# xgrammar's errors start with "[hh:mm:ss] /path/file.cc:123: "; the rest is the message.
_XGR_PREFIX = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")


class GrammarKind(enum.Enum):
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF = "ebnf"


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: GrammarKind
    source: str

    @property
    def key(self) -> tuple[str, str]:
        """The compile-cache key: same kind and same text compile to the same grammar."""
        return self.kind.value, self.source

    def to_log(self) -> str:
        """The constraint as BEGIN records it."""
        return json.dumps({"kind": self.kind.value, "source": self.source})


def spec_from_fields(json_schema: str | None, regex: str | None, ebnf: str | None) -> GrammarSpec | None:
    given = [(k, v) for k, v in ((GrammarKind.JSON_SCHEMA, json_schema), (GrammarKind.REGEX, regex),
                                 (GrammarKind.EBNF, ebnf)) if v is not None]
    if len(given) > 1:
        names = " and ".join(k.value for k, _ in given)
        raise InvalidRequestError(f"give at most one of json_schema, regex and ebnf (got {names})", given[1][0].value)
    if not given:
        return None
    kind, source = given[0]
    if not isinstance(source, str) or not source:
        raise InvalidRequestError(f"{kind.value} must be a non-empty string", kind.value)
    return GrammarSpec(kind, source)


def check_syntax(spec: GrammarSpec) -> None:
    """Parses the constraint (no tokenizer needed); InvalidRequestError naming the field if bad."""
    if spec.kind is GrammarKind.JSON_SCHEMA:
        try:
            schema = json.loads(spec.source)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"json_schema is not valid JSON: {exc}", "json_schema") from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError("json_schema must be a JSON object (a schema)", "json_schema")
    import xgrammar as xgr

    try:
        if spec.kind is GrammarKind.JSON_SCHEMA:
            xgr.Grammar.from_json_schema(spec.source)
        elif spec.kind is GrammarKind.REGEX:
            xgr.Grammar.from_regex(spec.source)
        else:
            xgr.Grammar.from_ebnf(spec.source)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError (sometimes others) on bad input
        raise InvalidRequestError(f"invalid {spec.kind.value}: {clean_error(exc)}", spec.kind.value) from None


def clean_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _XGR_PREFIX.sub("", text)
