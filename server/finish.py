"""The finish check run after each committed token: length, EOS, stop ids, stop strings."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from server.request import FinishKind, FinishReason, Req

Detokenize = Callable[[Sequence[int]], str]


def check_finish(req: Req, eos_ids: frozenset[int], context_len: int, detokenize: Detokenize) -> FinishReason | None:
    # Order follows SGLang: the length limit wins over a stop that lands on the same token.
    params, out = req.params, req.output_ids
    if len(out) >= params.max_new_tokens:
        return FinishReason(FinishKind.LENGTH, params.max_new_tokens)
    if req.total_len >= context_len:
        return FinishReason(FinishKind.LENGTH, len(out), "context length reached")
    last = out[-1]
    if last in params.stop_token_ids or (not params.ignore_eos and last in eos_ids):
        return FinishReason(FinishKind.STOP, last)
    if params.stop:
        return _check_stop_strings(out, params.stop, detokenize)
    return None


def _check_stop_strings(out: list[int], stops: tuple[str, ...], detokenize: Detokenize) -> FinishReason | None:
    # A stop string of n characters spans at most n tokens (each token is >= 1 byte of
    # text); one extra token covers a string that starts mid-token.
    window = max(len(s.encode()) for s in stops) + 1
    tail = detokenize(out[-window:])
    for stop in stops:
        if stop in tail:
            return FinishReason(FinishKind.STOP, stop)
    return None


def trim_at_stop(text: str, finish: FinishReason | None) -> str:
    """The returned text ends before a matched stop string, as in SGLang."""
    if finish is not None and finish.kind is FinishKind.STOP and isinstance(finish.matched, str):
        cut = text.find(finish.matched)
        if cut >= 0:
            return text[:cut]
    return text
