"""SGLang-shaped result dicts built from a finished (or streaming) request."""
from __future__ import annotations

import time
from typing import Any

from server.finish import trim_at_stop
from server.request import Req
from server.tokenizer import Tokenizer


def format_output(req: Req, tokenizer: Tokenizer) -> dict[str, Any]:
    text = trim_at_stop(tokenizer.decode(req.output_ids, req.params.skip_special_tokens), req.finish)
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish.to_dict() if req.finish else None,
        "prompt_tokens": req.prompt_len,
        "completion_tokens": len(req.output_ids),
        "cached_tokens": 0,
        "e2e_latency": (req.finish_time or time.monotonic()) - req.arrival_time,
    }
    if req.logprob.return_logprob:
        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(req.output_logprobs, req.output_ids)]
        meta["output_top_logprobs"] = [[(lp, t, None) for t, lp in top] for top in req.output_top_logprobs]
        if req.wants_input_logprobs:
            positions = range(req.prompt_len - len(req.input_logprobs), req.prompt_len)
            meta["input_token_logprobs"] = [(lp, req.prompt_ids[p], None) for p, lp in zip(positions, req.input_logprobs)]
    if req.logprob.return_hidden_states:
        meta["hidden_states"] = req.hidden_states
    return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}
