"""A radix tree of token ids → KV slots that holds only committed KV, shared by prompts with a
common prefix.

Only the scheduler's finish path inserts, and only up to a request's committed watermark
(`RequestState.kv_committed_len`): slots written by a forward whose result was discarded never
enter. A request admitted on a match locks the matched path (its slots cannot be evicted while
the request lives) and unlocks it when it finishes, for any reason. Eviction frees unlocked
leaves, least recently used first. Recency is a logical clock (one tick per match or insert),
not wall time, so the same sequence of operations always evicts the same nodes.

The eviction order lives in a heap kept across calls, not one rebuilt from the whole tree per call:
once the pool is full, every admission evicts a little, and a walk over every node each time cost
~0.25 ms an admission with a few hundred cached prompts (3 % of an offline run). Entries are pushed
when a node becomes an unlocked leaf and checked when popped (stale ones are dropped or re-keyed),
so the heap pops exactly what a fresh least-recently-used scan would.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from server.memory import TokenToKVPool


@dataclass(eq=False, slots=True)
class TreeNode:
    key: list[int]  # the token ids on the edge into this node
    slots: torch.Tensor  # their KV slots, one per id
    parent: TreeNode | None = None
    children: dict[int, TreeNode] = field(default_factory=dict)  # by the child's first token id
    lock_count: int = 0  # live requests whose matched prefix runs through this node
    last_used: int = 0  # logical clock of the latest match or insert through it

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    slots: torch.Tensor  # KV slots of the matched prefix, in order
    node: TreeNode  # the deepest node of the match (the root when nothing matched)

    @property
    def length(self) -> int:
        return int(self.slots.numel())


class RadixCache:
    def __init__(self, kv_pool: TokenToKVPool) -> None:
        self.kv_pool = kv_pool
        self.root = TreeNode([], torch.empty(0, dtype=torch.int64, device=kv_pool.device))
        self.root.lock_count = 1  # never evicted
        self.num_tokens = 0  # slots the tree holds
        self.num_locked_tokens = 0  # of those, slots on a path some live request has locked
        self._clock = 0
        self._num_nodes = 0  # the root excluded
        # (last_used when pushed, id, node): every unlocked leaf has an entry; an entry may be stale.
        self._lru: list[tuple[int, int, TreeNode]] = []

    @property
    def num_evictable_tokens(self) -> int:
        return self.num_tokens - self.num_locked_tokens

    # -- lookup ----------------------------------------------------------------------
    def match_prefix(self, ids: list[int], max_len: int) -> PrefixMatch:
        """The longest cached prefix of `ids[:max_len]`; an edge matched part-way is split so the
        match ends on a node (which a request can then lock)."""
        self._clock += 1
        node, _, parts = self._descend(ids, max_len)
        return PrefixMatch(torch.cat(parts) if parts else self.root.slots, node)

    def peek_prefix_len(self, ids: list[int], max_len: int) -> int:
        """What `match_prefix` would match, without splitting or touching anything: a pure read, so
        asking it (how often depends on timing) never changes what is evicted later."""
        node, pos = self.root, 0
        while pos < max_len and (child := node.children.get(ids[pos])) is not None:
            n = common_prefix_len(child.key, ids, pos, max_len)
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def lock(self, node: TreeNode) -> None:
        for n in _path(node):
            if n.lock_count == 0:
                self.num_locked_tokens += len(n.key)
            n.lock_count += 1

    def unlock(self, node: TreeNode) -> None:
        for n in _path(node):
            assert n.lock_count > 0, "radix node unlocked more often than locked"
            n.lock_count -= 1
            if n.lock_count == 0:
                self.num_locked_tokens -= len(n.key)
                if n.is_leaf:
                    self._push(n)

    # -- insertion and eviction ------------------------------------------------------
    def insert(self, ids: list[int], slots: torch.Tensor) -> tuple[int, TreeNode]:
        """Adds committed KV for `ids`. Returns how many leading ids were already cached (the
        caller's own slots for those are duplicates it must free, unless they are the tree's) and
        the node where `ids` end."""
        assert len(ids) == slots.numel(), "one KV slot per token id"
        self._clock += 1
        node, pos, _ = self._descend(ids, len(ids))
        already = pos
        if pos < len(ids):
            leaf = TreeNode(list(ids[pos:]), slots[pos:].clone(), node, last_used=self._clock)
            node.children[ids[pos]] = leaf
            self.num_tokens += len(leaf.key)
            self._num_nodes += 1
            self._push(leaf)
            node = leaf
        return already, node

    def evict(self, num_tokens: int) -> int:
        """Frees at least `num_tokens` slots from unlocked leaves, least recently used first, or
        as many as are evictable; returns the number freed."""
        freed = 0
        while freed < num_tokens and self._lru:
            pushed_at, _, leaf = heapq.heappop(self._lru)
            if not self._evictable(leaf):
                continue  # locked, or a parent, since it was pushed: its unlock or last child pushes it again
            if pushed_at != leaf.last_used:
                self._push(leaf)  # used since it was pushed: it waits its turn under its new time
                continue
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            leaf.parent = None  # out of the tree: any other entry of it is stale
            self.kv_pool.free(leaf.slots)
            self.num_tokens -= len(leaf.key)
            self._num_nodes -= 1
            freed += len(leaf.key)
            if self._evictable(parent):  # the root never is (no parent)
                self._push(parent)
        return freed

    def _evictable(self, node: TreeNode) -> bool:
        """An unlocked leaf still in the tree (an evicted node's parent is cleared; the root has none)."""
        return node.parent is not None and node.is_leaf and node.lock_count == 0

    def _push(self, node: TreeNode) -> None:
        heapq.heappush(self._lru, (node.last_used, id(node), node))
        if len(self._lru) > 4 * self._num_nodes + 64:
            # Stale entries pile up where nothing is evicted (an unlock pushes, only an eviction pops):
            # rebuilt from the evictable leaves (`node` among them), the heap stays a few entries per node.
            self._lru = [(n.last_used, id(n), n) for n in self._nodes() if self._evictable(n)]
            heapq.heapify(self._lru)

    def reset(self) -> int:
        """Frees every slot (only when nothing is locked); returns the number freed."""
        assert self.num_locked_tokens == 0, "cannot flush a prefix cache that live requests use"
        return self.evict(self.num_tokens)

    # -- accounting ------------------------------------------------------------------
    def held_slots(self) -> torch.Tensor:
        parts = [n.slots for n in self._nodes() if n is not self.root]
        return torch.cat(parts) if parts else self.root.slots

    def check_integrity(self) -> None:
        nodes = [n for n in self._nodes() if n is not self.root]
        assert sum(len(n.key) for n in nodes) == self.num_tokens, "radix token count drifted"
        assert sum(len(n.key) for n in nodes if n.lock_count) == self.num_locked_tokens, "radix lock count drifted"
        for n in nodes:
            assert n.parent is not None and n.parent.children.get(n.key[0]) is n, "radix child link broken"
            assert len(n.key) == n.slots.numel() > 0, "radix node without one slot per id"
            assert n.lock_count <= n.parent.lock_count or n.parent is self.root, "child locked beyond its parent"
        assert len(nodes) == self._num_nodes, "radix node count drifted"
        queued = {id(node) for _, _, node in self._lru}
        assert all(id(n) in queued for n in nodes if self._evictable(n)), "an unlocked leaf is missing from the eviction heap"

    def _nodes(self) -> Iterator[TreeNode]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _descend(self, ids: list[int], stop: int) -> tuple[TreeNode, int, list[torch.Tensor]]:
        """Walks down along `ids[:stop]`, splitting an edge matched part-way and marking every node
        passed as used now; returns the last node, how many ids it matched, and their slots."""
        node, pos, parts = self.root, 0, []
        while pos < stop and (child := node.children.get(ids[pos])) is not None:
            n = common_prefix_len(child.key, ids, pos, stop)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_used = self._clock
            parts.append(child.slots)
            node, pos = child, pos + n
        return node, pos, parts

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cuts `child`'s edge after `n` ids; returns the new upper node (which keeps the locks)."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = TreeNode(child.key[:n], child.slots[:n], parent, {child.key[n]: child},
                         child.lock_count, child.last_used)
        parent.children[child.key[0]] = upper
        self._num_nodes += 1  # the upper node is no leaf: no heap entry
        child.key, child.slots, child.parent = child.key[n:], child.slots[n:], upper
        return upper


def common_prefix_len(key: list[int], ids: list[int], start: int = 0, stop: int | None = None) -> int:
    """How many leading items of `key` equal `ids[start:stop]`, item by item."""
    stop = len(ids) if stop is None else stop
    limit = min(len(key), stop - start)
    if limit <= 0 or key[0] != ids[start]:
        return 0  # most keys differ at once (distinct prompts): no slice copies for them
    if key[:limit] == ids[start : start + limit]:  # one C-level compare: the common case for long prompts
        return limit
    n = 0
    while key[n] == ids[start + n]:
        n += 1
    return n


def _path(node: TreeNode) -> Iterator[TreeNode]:
    """`node` and its ancestors, the root excluded."""
    current: TreeNode | None = node
    while current is not None and current.parent is not None:
        yield current
        current = current.parent
