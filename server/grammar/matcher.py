"""One request's grammar matcher, as its transactions stage it.

Wraps xgrammar's GrammarMatcher with the two calls a `RequestTxn` makes (`accept_token`,
`rollback`) and keeps the accepted token ids, so a test or an audit can check that the
matcher has accepted exactly the committed tokens.
"""
from __future__ import annotations

from typing import Any


class RequestGrammar:
    __slots__ = ("matcher", "accepted")

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher  # xgrammar.GrammarMatcher
        self.accepted: list[int] = []

    def accept_token(self, token_id: int) -> bool:
        ok = bool(self.matcher.accept_token(token_id))
        if ok:
            self.accepted.append(token_id)
        return ok

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= len(self.accepted):
            raise ValueError(f"cannot roll back {num_tokens} token(s); {len(self.accepted)} accepted")
        if num_tokens:
            self.matcher.rollback(num_tokens)
            del self.accepted[-num_tokens:]

    def fill_mask(self, bitmask: Any, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())
