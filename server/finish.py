"""The finish check staged in each result's transaction: length, EOS, stop ids, stop strings."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from commitlog import FinishReason
from server.sampling.params import SamplingParams

Detokenize = Callable[[Sequence[int]], str]
Finish = tuple[FinishReason, int | str | None]


def check_finish(
    output_ids: Sequence[int], prompt_len: int, params: SamplingParams, eos_ids: frozenset[int],
    context_len: int, detokenize: Detokenize,
) -> Finish | None:
    """`output_ids` includes the token being staged. Returns (reason, matched) or None."""
    # Order follows SGLang: the length limit wins over a stop that lands on the same token.
    if len(output_ids) >= params.max_new_tokens:
        return FinishReason.LENGTH, params.max_new_tokens
    if prompt_len + len(output_ids) >= context_len:
        return FinishReason.LENGTH, len(output_ids)
    last = output_ids[-1]
    if last in params.stop_token_ids or (not params.ignore_eos and last in eos_ids):
        return FinishReason.STOP, last
    if params.stop:
        return _check_stop_strings(output_ids, params.stop, detokenize)
    return None


def _check_stop_strings(out: Sequence[int], stops: tuple[str, ...], detokenize: Detokenize) -> Finish | None:
    # A stop string of n bytes spans at most n tokens (each token is >= 1 byte of text);
    # one extra token covers a string that starts mid-token.
    window = max(len(s.encode()) for s in stops) + 1
    tail = detokenize(out[-window:])
    for stop in stops:
        if stop in tail:
            return FinishReason.STOP, stop
    return None


def trim_at_stop(text: str, reason: FinishReason | None, matched: object) -> str:
    """The returned text ends before a matched stop string, as in SGLang."""
    if reason is FinishReason.STOP and isinstance(matched, str):
        cut = text.find(matched)
        if cut >= 0:
            return text[:cut]
    return text
