"""SGLang-shaped result dicts built from a request's committed state."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from server.finish import trim_at_stop
from server.request import Req, finish_reason_dict
from server.tokenizer import Tokenizer


def format_output(req: Req, tokenizer: Tokenizer) -> dict[str, Any]:
    state = req.state
    text = tokenizer.decode(state.output_ids, req.params.skip_special_tokens)
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": finish_reason_dict(state),
        "prompt_tokens": req.prompt_len,
        "completion_tokens": len(state.output_ids),
        "cached_tokens": 0,
        "e2e_latency": (req.finish_time or time.monotonic()) - req.arrival_time,
    }
    if req.logprob.return_logprob:
        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(state.output_logprobs, state.output_ids)]
        meta["output_top_logprobs"] = [[(lp, t, None) for t, lp in top] for top in state.output_top_logprobs]
        if req.wants_input_logprobs:
            meta["input_token_logprobs"] = _input_logprobs(req)
    if req.logprob.return_hidden_states:
        meta["hidden_states"] = [np.frombuffer(b, dtype=np.float32).tolist() for b in state.hidden_states]
    return {"text": trim_at_stop(text, state.finish_reason, state.finish_matched), "output_ids": list(state.output_ids),
            "meta_info": meta}


def _input_logprobs(req: Req) -> list[tuple[float | None, int, None]]:
    # Position 0 has no preceding context; like SGLang it is reported as None.
    start = req.logprob.logprob_start_len
    first = [(None, req.prompt_ids[0], None)] if start == 0 else []
    scored = range(max(start, 1), req.prompt_len)
    return first + [(lp, req.prompt_ids[p], None) for p, lp in zip(scored, req.state.input_logprobs)]
