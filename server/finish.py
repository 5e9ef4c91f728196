"""The finish check staged in each result's transaction: length, EOS, stop ids, stop strings."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from commitlog import FinishReason
from server.sampling.params import SamplingParams

Detokenize = Callable[[Sequence[int]], str]
Finish = tuple[FinishReason, int | str | None]


def check_finish(
    committed: Sequence[int], token: int, prompt_len: int, params: SamplingParams, eos_ids: frozenset[int],
    context_len: int, detokenize: Detokenize,
) -> Finish | None:
    """Would staging `token` after the `committed` output finish the request? (reason, matched) or None.

    The staged token comes apart from the committed ids so that the common case (no stop
    strings) never copies a request's whole output once per step."""
    num_out = len(committed) + 1
    # Order follows SGLang: the length limit wins over a stop that lands on the same token.
    if num_out >= params.max_new_tokens:
        return FinishReason.LENGTH, params.max_new_tokens
    if prompt_len + num_out >= context_len:
        return FinishReason.LENGTH, num_out
    if num_out < params.min_new_tokens:
        return None  # the sampler masks EOS and stop ids until then; stop strings wait too (as in vLLM)
    if token in params.stop_token_ids or (not params.ignore_eos and token in eos_ids):
        return FinishReason.STOP, token
    if params.stop:
        return _check_stop_strings([*committed, token], params.stop, detokenize)
    return None


def _check_stop_strings(out: Sequence[int], stops: tuple[str, ...], detokenize: Detokenize) -> Finish | None:
    tail = _stop_window(out, max(len(s) for s in stops), detokenize)
    for stop in stops:
        if stop in tail:
            return FinishReason.STOP, stop
    return None


def _stop_window(out: Sequence[int], longest: int, detokenize: Detokenize) -> str:
    """Decoded text of a tail long enough to hold any stop string that overlaps the newest token.

    Counted in decoded characters, not tokens: a special token decodes to nothing, so any
    fixed token count can be eaten by them. The window grows (doubling) until the tokens
    after its first one already decode to `longest` characters beyond the newest token's
    own text, so a stop string starting mid-way through the first token is still inside.
    """
    need = longest + len(detokenize(out[-1:]))
    k = longest + 1
    while k < len(out) and len(detokenize(out[-k + 1:])) < need:
        k *= 2
    return detokenize(out[-k:])


def shown_text(ids: Sequence[int], decode: Detokenize, finish: dict[str, object] | None, no_stop_trim: bool = False) -> str:
    """The output text a client is shown, trimmed as SGLang trims it: without a matched stop
    token's own text and cut before a matched stop string; `no_stop_trim` keeps both. The server's
    responses and the log tools (export, replay) both decode through here."""
    finish = finish or {}
    reason = FinishReason(finish["type"]) if finish else None
    matched = finish.get("matched")
    trim = not no_stop_trim and reason is FinishReason.STOP
    if trim and isinstance(matched, int) and not isinstance(matched, bool) and ids and ids[-1] == matched:
        ids = ids[:-1]
    text = decode(ids)
    return trim_at_stop(text, reason, matched) if trim else text


def trim_at_stop(text: str, reason: FinishReason | None, matched: object) -> str:
    """The returned text ends before a matched stop string, as in SGLang."""
    if reason is FinishReason.STOP and isinstance(matched, str):
        cut = text.find(matched)
        if cut >= 0:
            return text[:cut]
    return text
