"""Streamed text is decoded incrementally, yet its chunks add up to exactly the full decode."""
from __future__ import annotations

import random

import pytest

from server.http.incremental import IncrementalText
from server.request import LogprobRequest
from server.response import CommittedView
from server.tokenizer import Tokenizer


class CountingTokenizer:
    """The real tokenizer, counting how many token ids each decode call is handed."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.decoded_ids = 0

    def decode(self, ids, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> str:
        self.decoded_ids += len(ids)
        return self.inner.decode(ids, skip_special_tokens)


def stream(tokenizer, ids: list[int], seed: int, stops: tuple[str, ...] = ()) -> str:
    rng = random.Random(seed)
    view = CommittedView("r", [1], LogprobRequest(False, 0, -1, False))
    text = IncrementalText(tokenizer, stops)
    out, i = [], 0
    while i < len(ids):
        step = rng.randint(1, 3)
        view.output_ids.extend(ids[i:i + step])
        i += step
        if i >= len(ids):
            view.finish = {"type": "length", "length": len(ids)}
        out.append(text.next_chunk(view))
    return "".join(out)


@pytest.mark.parametrize("seed", range(12))
def test_incremental_chunks_add_up_to_the_full_decode(tiny_checkpoint, seed):
    tokenizer = Tokenizer(tiny_checkpoint("llama"))
    rng = random.Random(seed)
    vocab = tokenizer.hf_tokenizer().vocab_size
    ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 80))]  # byte tokens split characters often
    assert stream(tokenizer, ids, seed) == tokenizer.decode(ids)


def test_a_long_stream_decodes_each_token_a_bounded_number_of_times(tiny_checkpoint):
    tokenizer = CountingTokenizer(Tokenizer(tiny_checkpoint("llama")))
    rng = random.Random(0)
    ids = [rng.randrange(300, 500) for _ in range(400)]
    text = stream(tokenizer, ids, 0)
    assert text == tokenizer.inner.decode(ids)
    # A full re-decode per chunk would hand ~400 * 200 / 2 = 40,000 ids to decode.
    assert tokenizer.decoded_ids < 10 * len(ids), tokenizer.decoded_ids
