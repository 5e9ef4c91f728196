"""What the scheduler asks of the prefix cache, in one place: match and lock at admission,
adopt a prompt's KV once its prefill has committed, give back a finished request's KV (its
committed part to the tree, the rest to the pool), and account for who owns every slot.

With `--disable-radix-cache` the tree is None and every method is the plain path (no match, all
KV freed at finish), so the scheduler has no second code path.

Ownership of a live request's row: slots [0, owned_len) are the tree's, locked by the request's
`cache_node`; slots [owned_len, kv_allocated_len) are the request's own.
"""
from __future__ import annotations

import torch

from server.memory import ReqToTokenPool, TokenToKVPool
from server.radix_cache import RadixCache, common_prefix_len
from server.request import Req

# A waiting request that shares at least this many more prompt tokens with a prefill in flight
# than the tree holds now waits for that prefill to commit instead of computing them again.
MIN_SHARED_TO_WAIT = 64


class PrefixCache:
    def __init__(self, kv_pool: TokenToKVPool, req_pool: ReqToTokenPool, tree: RadixCache | None) -> None:
        self.kv_pool = kv_pool
        self.req_pool = req_pool
        self.tree = tree

    @property
    def num_tokens(self) -> int:
        return self.tree.num_tokens if self.tree else 0

    # -- admission --------------------------------------------------------------------
    def lock_prefix(self, req: Req) -> torch.Tensor | None:
        """Matches and locks the longest usable cached prefix of `req`'s prompt; returns its slots
        (None: no match). Locked before the caller counts what is evictable."""
        if self.tree is None:
            return None
        match = self.tree.match_prefix(req.prompt_ids, _max_prefix(req))
        if not match.length:
            return None
        self.tree.lock(match.node)
        req.cache_node, req.owned_len, req.cached_len = match.node, match.length, match.length
        return match.slots

    def unlock_prefix(self, req: Req) -> None:
        if self.tree is not None and req.cache_node is not None:
            self.tree.unlock(req.cache_node)
        req.cache_node, req.owned_len = None, 0

    def make_room(self, over: int) -> bool:
        """Evicts `over` unlocked tokens if that many are evictable (else evicts nothing)."""
        if over <= 0:
            return True
        if self.tree is None or self.tree.num_evictable_tokens < over:
            return False
        self.tree.evict(over)
        return True

    def should_wait(self, req: Req, prefilling: list[Req]) -> bool:
        """Should `req` wait for a prefill in flight that will put much of its prompt in the tree?"""
        if self.tree is None or not prefilling:
            return False
        cached = self.tree.peek_prefix_len(req.prompt_ids, _max_prefix(req))
        shared = max(common_prefix_len(req.prompt_ids, other.prompt_ids) for other in prefilling)
        return min(shared, _max_prefix(req)) >= cached + MIN_SHARED_TO_WAIT

    # -- commits and finishes ------------------------------------------------------------
    def adopt_prompt(self, req: Req) -> int:
        """The prompt's KV has just committed: the tree takes it (locked by `req`) so requests
        arriving now can share it. Returns the slots adopted (the caller's reservation shrinks by
        them). Skipped when another request's copy is in the tree already."""
        if self.tree is None or req.pool_row is None or req.owned_len >= req.prompt_len:
            return 0
        if self.tree.peek_prefix_len(req.prompt_ids, req.prompt_len) != req.owned_len:
            return 0  # someone else's copy: ours stays ours, and is freed at finish
        slots = self.req_pool.table[req.pool_row, : req.prompt_len]
        already, node = self.tree.insert(req.prompt_ids, slots.clone())
        assert already == req.owned_len, "the tree changed between match and insert"
        self.tree.lock(node)
        if req.cache_node is not None:
            self.tree.unlock(req.cache_node)
        adopted = req.prompt_len - req.owned_len
        req.cache_node, req.owned_len = node, req.prompt_len
        return adopted

    def release(self, req: Req, slots: torch.Tensor) -> None:
        """Frees a finished request's KV except its committed part, which the tree keeps.

        Only KV below the committed watermark enters the tree: slots written by a forward
        whose result was discarded (an aborted final chunk) or is still pending are freed."""
        if self.tree is None:
            self.kv_pool.free(slots)
            return
        # The owned prefix is committed KV already, even before the request's first commit.
        committed = max(req.state.kv_committed_len, req.owned_len)
        ids = (req.prompt_ids + req.output_ids)[:committed]
        already, _ = self.tree.insert(ids, slots[:committed])
        # [owned_len, already): this request's own copies of KV the tree got from another one.
        self.kv_pool.free(slots[req.owned_len : already])
        self.kv_pool.free(slots[committed:])
        self.unlock_prefix(req)

    def flush(self) -> None:
        if self.tree is not None:
            self.tree.reset()

    # -- accounting -------------------------------------------------------------------
    def check_integrity(self, live: list[Req]) -> None:
        if self.tree is None:
            return
        self.tree.check_integrity()
        # Every used slot has exactly one owner: the tree, or the one live request that wrote it.
        owned = [self.tree.held_slots()] + [self.req_pool.table[r.pool_row, r.owned_len : r.kv_allocated_len]
                                            for r in live if r.pool_row is not None]
        slots = torch.cat(owned)
        assert int(torch.unique(slots).numel()) == slots.numel() == self.kv_pool.num_used, "a KV slot has two owners"
        if not live:
            assert self.tree.num_locked_tokens == 0, "prefix cache still locked after a drain"


def _max_prefix(req: Req) -> int:
    # The last prompt token is always computed (its logits sample the first output); prompt
    # logprobs need the logits of every position from logprob_start_len - 1 on.
    limit = req.prompt_len - 1
    if req.wants_input_logprobs:
        limit = min(limit, max(req.logprob.logprob_start_len, 1) - 1)
    return max(limit, 0)
