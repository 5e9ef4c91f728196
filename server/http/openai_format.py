"""OpenAI response objects and stream chunks, built from committed views."""
from __future__ import annotations

import time
from typing import Any

from server.response import CommittedView
from server.tokenizer import Tokenizer


def finish_reason(view: CommittedView) -> str | None:
    return None if view.finish is None else str(view.finish["type"])


def usage(views: list[CommittedView]) -> dict[str, Any]:
    prompt = sum(len(v.prompt_ids) for v in views)
    completion = sum(len(v.output_ids) for v in views)
    cached = sum(v.cached_tokens for v in views)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def envelope(rid: str, kind: str, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices}


def completion_logprobs(view: CommittedView, tok: Tokenizer, start: int, k: int, whole: bool = False) -> dict[str, Any]:
    """The output's logprobs from token `start` on. `whole`: a complete (non-streamed) answer, which
    also gets `text_offset` (a streamed chunk's offsets would need every earlier token: null there)."""
    ids = view.output_ids[start:]
    tops = view.output_top_logprobs[start:] if k else []
    tokens = [tok.token_text(t) for t in ids]
    return {
        "tokens": tokens,
        "token_logprobs": view.output_logprobs[start : start + len(ids)],
        "top_logprobs": [{tok.token_text(t): lp for t, lp in top} for top in tops] if k else None,
        "text_offset": _offsets(tokens, 0) if whole else None,
    }


def whole_completion_logprobs(view: CommittedView, tok: Tokenizer, k: int, echo: bool) -> dict[str, Any]:
    """A finished (non-streamed) completion's logprobs object; with `echo`, the prompt's come first."""
    return echo_logprobs(view, tok, k) if echo else completion_logprobs(view, tok, 0, k, whole=True)


def echo_text(view: CommittedView, tok: Tokenizer, prompt_texts: tuple[str, ...], index: int) -> str:
    """The prompt to echo: as sent when it was text, else its tokens decoded. Choices are built
    prompts-major for each sample (openai_api._build), so choice `index` echoes prompt index mod count."""
    if prompt_texts:
        return prompt_texts[index % len(prompt_texts)]
    return tok.decode(view.prompt_ids, view.skip_special_tokens)


def echo_logprobs(view: CommittedView, tok: Tokenizer, k: int) -> dict[str, Any]:
    """`echo` with `logprobs`: the prompt's tokens and logprobs, then the output's, as one list.
    The first prompt token has no context, so its logprob (and top list) is null, as in OpenAI's
    API; `text_offset` runs over the concatenated token texts."""
    prompt = [tok.token_text(t) for t in view.prompt_ids]
    out = completion_logprobs(view, tok, 0, k)
    scored = len(view.prompt_ids) - 1
    token_logprobs: list[float | None] = [None, *view.input_logprobs[:scored]]
    top: list[dict[str, float] | None] | None = None
    if k:
        top = [None, *({tok.token_text(t): lp for t, lp in pairs} for pairs in view.input_top_logprobs[:scored])]
        top += out["top_logprobs"]
    tokens = prompt + out["tokens"]
    return {"tokens": tokens, "token_logprobs": token_logprobs + out["token_logprobs"], "top_logprobs": top,
            "text_offset": _offsets(tokens, 0)}


def _offsets(tokens: list[str], base: int) -> list[int]:
    offsets = []
    for text in tokens:
        offsets.append(base)
        base += len(text)
    return offsets


def chat_logprobs(view: CommittedView, tok: Tokenizer, start: int, k: int) -> dict[str, Any]:
    content = []
    for j, (t, lp) in enumerate(zip(view.output_ids[start:], view.output_logprobs[start:])):
        top = view.output_top_logprobs[start + j] if k else []
        content.append({
            "token": tok.token_text(t), "logprob": lp, "bytes": list(tok.token_text(t).encode()),
            "top_logprobs": [{"token": tok.token_text(i), "logprob": v, "bytes": list(tok.token_text(i).encode())}
                             for i, v in top],
        })
    return {"content": content}
