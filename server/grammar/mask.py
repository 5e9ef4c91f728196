"""The batched grammar mask: one bitmask row per constrained request, applied to the fp32
logits in place before sampling (masked tokens become -inf)."""
from __future__ import annotations

import torch

from server.grammar.matcher import RequestGrammar


def apply_grammar_masks(logits: torch.Tensor, grammars: list[RequestGrammar | None]) -> None:
    """`grammars[i]` constrains row i of `logits`; None rows are left as they are."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    if not rows:
        return
    import xgrammar as xgr

    vocab = logits.shape[-1]
    bitmask = xgr.allocate_token_bitmask(len(grammars), vocab)
    for i in rows:
        grammar = grammars[i]
        assert grammar is not None
        grammar.fill_mask(bitmask, i)
    if logits.device.type != "cpu":  # the matchers fill a host bitmask; the kernel reads it beside the logits
        bitmask = bitmask.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=rows)
