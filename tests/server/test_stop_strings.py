"""Stop strings are found by decoded characters, however many special tokens sit inside them."""
from __future__ import annotations

from collections.abc import Sequence

from commitlog import FinishReason
from server.finish import check_finish
from server.sampling.params import SamplingParams

# A toy vocabulary: ids 0..25 are the letters a..z; ids >= 100 are special tokens that
# decode to nothing (as a tokenizer does with skip_special_tokens).
SPECIAL = 100


def detokenize(ids: Sequence[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids if i < SPECIAL)


def _ids(text: str) -> list[int]:
    return [ord(c) - ord("a") for c in text]


def _check(out: list[int], stop: str):
    params = SamplingParams(max_new_tokens=1000, stop=(stop,))
    return check_finish(out[:-1], out[-1], 0, params, frozenset(), 10_000, detokenize)


def test_stop_string_spanning_two_special_tokens_is_found():
    out = [*_ids("xx"), *_ids("ab"), SPECIAL, SPECIAL + 1, *_ids("c")]
    assert _check(out, "abc") == (FinishReason.STOP, "abc")


def test_stop_string_spanning_many_special_tokens_is_found():
    out = [*_ids("q"), *_ids("a"), *([SPECIAL] * 9), *_ids("bc")]
    assert _check(out, "abc") == (FinishReason.STOP, "abc")


def test_stop_string_absent_is_not_reported():
    out = [*_ids("ab"), SPECIAL, SPECIAL, *_ids("d")]
    assert _check(out, "abc") is None
