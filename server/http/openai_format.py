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


def completion_logprobs(view: CommittedView, tok: Tokenizer, start: int, k: int) -> dict[str, Any]:
    ids = view.output_ids[start:]
    tops = view.output_top_logprobs[start:] if k else []
    return {
        "tokens": [tok.token_text(t) for t in ids],
        "token_logprobs": view.output_logprobs[start : start + len(ids)],
        "top_logprobs": [{tok.token_text(t): lp for t, lp in top} for top in tops] if k else None,
        "text_offset": None,
    }


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
