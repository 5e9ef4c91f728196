"""The radix prefix cache: reuse of a shared prompt prefix, only committed KV in the tree, locks
held by live requests, LRU eviction when admission needs memory (DESIGN I2, I4, I8)."""
from __future__ import annotations

import pytest
import torch
from abort_window import drive_to_final_chunk_pending
from abort_window import prompt as _prompt
from hypothesis import example, given
from hypothesis import strategies as st
from scripted import ScriptedRuntime

from commitlog import Kind
from server.forward_batch import ForwardMode
from server.memory import TokenToKVPool
from server.radix_cache import RadixCache, common_prefix_len

CHUNK = 16


def _cache_of(n: int) -> RadixCache:
    return RadixCache(TokenToKVPool(n, 1, 1, 2, torch.float32))


def _insert(cache: RadixCache, ids: list[int]) -> torch.Tensor:
    slots = cache.kv_pool.alloc(len(ids))
    assert slots is not None
    cache.insert(ids, slots)
    return slots


# -- the tree alone -----------------------------------------------------------------------
@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12),
       st.integers(0, 12), st.integers(0, 12))
def test_common_prefix_len_counts_the_leading_items_equal_to_the_window(key, ids, start, width):
    # Small alphabets make long shared runs and first-item matches common: every early exit is exercised.
    start = min(start, len(ids))
    stop = min(len(ids), start + width)
    naive = 0
    while naive < min(len(key), stop - start) and key[naive] == ids[start + naive]:
        naive += 1
    assert common_prefix_len(key, ids, start, stop) == naive


def test_match_splits_an_edge_and_insert_reports_what_was_already_cached():
    cache = _cache_of(64)
    slots = _insert(cache, [1, 2, 3, 4, 5])
    match = cache.match_prefix([1, 2, 3, 9, 9], max_len=5)
    assert match.length == 3 and match.slots.tolist() == slots[:3].tolist()
    assert match.node.key == [1, 2, 3]  # the edge was split so the match ends on a node
    other = cache.kv_pool.alloc(5)
    assert cache.insert([1, 2, 3, 7, 8], other)[0] == 3  # the caller frees its own copy of [1, 2, 3]
    assert cache.num_tokens == 7
    assert cache.match_prefix([1, 2, 3, 4, 5, 6], max_len=4).length == 4  # max_len caps the match
    cache.check_integrity()


def test_eviction_frees_least_recently_used_unlocked_leaves_and_never_a_locked_path():
    cache = _cache_of(64)
    _insert(cache, [1, 1, 1])
    _insert(cache, [2, 2, 2])
    _insert(cache, [3, 3, 3])
    locked = cache.match_prefix([1, 1, 1], max_len=3)  # the oldest insert, now locked
    cache.lock(locked.node)
    cache.match_prefix([3, 3, 3], max_len=3)  # [3, 3, 3] used more recently than [2, 2, 2]
    assert cache.evict(1) == 3
    assert cache.match_prefix([2, 2, 2], max_len=3).length == 0  # the least recently used went first
    assert cache.evict(100) == 3  # everything unlocked goes; the locked path stays
    assert cache.match_prefix([1, 1, 1], max_len=3).length == 3
    cache.unlock(locked.node)
    assert cache.num_evictable_tokens == 3 and cache.reset() == 3 and cache.kv_pool.num_free == 64
    cache.check_integrity()


# -- the scheduler with the cache -----------------------------------------------------------
@pytest.fixture
def rt(tiny_checkpoint, tmp_path):
    runtime = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log", chunked_prefill_size=CHUNK)
    yield runtime
    runtime.drain()
    runtime.sched.check_integrity()  # every slot free or held, unlocked, by the tree
    assert runtime.sched.kv_live_tokens == 0
    runtime.close()


def _lru_scan_order(cache: RadixCache, num_tokens: int) -> list[list[int]]:
    """The slots eviction should free, leaf by leaf, found by a fresh scan of the whole tree (the order
    the kept heap must reproduce): least recently used unlocked leaf first, a parent joining once it is
    an unlocked leaf itself."""
    nodes = [n for n in cache._nodes() if n is not cache.root]
    leaves = {id(n): n for n in nodes if n.is_leaf and n.lock_count == 0}
    children = {id(n): len(n.children) for n in nodes}
    freed, order = 0, []
    while freed < num_tokens and leaves:
        leaf = min(leaves.values(), key=lambda n: (n.last_used, id(n)))
        del leaves[id(leaf)]
        order.append(leaf.slots.tolist())
        freed += len(leaf.key)
        parent = leaf.parent
        if parent is not cache.root:
            children[id(parent)] -= 1
            if children[id(parent)] == 0 and parent.lock_count == 0:
                leaves[id(parent)] = parent
    return order


_OPS = st.lists(st.tuples(st.sampled_from(["insert", "match", "match_lock", "unlock", "evict"]),
                          st.lists(st.integers(0, 2), min_size=1, max_size=6), st.integers(1, 12)),
                max_size=40)


@given(_OPS)
# A leaf evicted while locked loses its entry; its unlock must queue it again.
@example([("insert", [1], 1), ("match_lock", [1], 1), ("evict", [0], 1), ("unlock", [0], 0), ("evict", [0], 1)])
# A leaf used since it was queued must wait behind one used earlier.
@example([("insert", [1], 1), ("insert", [2], 1), ("match", [1], 1), ("evict", [0], 1)])
def test_eviction_heap_frees_what_a_fresh_lru_scan_of_the_tree_would(ops):
    """The eviction heap is kept across calls (pushed on insert and unlock, checked when popped); it must
    free exactly the leaves, in exactly the order, that a scan of every node at that moment would:
    never a locked path, a leaf used since it was pushed under its new time, a parent after its last
    child. Small alphabets make shared prefixes, splits and re-used leaves common."""
    cache = _cache_of(4096)
    freed_slots: list[list[int]] = []
    free = cache.kv_pool.free
    cache.kv_pool.free = lambda slots: (freed_slots.append(slots.tolist()), free(slots))[1]
    locked = []
    for op, ids, n in ops:
        if op == "insert" and cache.peek_prefix_len(ids, len(ids)) < len(ids):
            _insert(cache, ids)
        elif op == "match":  # a match whose request was not admitted: used, not locked
            cache.match_prefix(ids, len(ids))
        elif op == "match_lock":
            match = cache.match_prefix(ids, len(ids))
            if match.length:
                cache.lock(match.node)
                locked.append(match.node)
        elif op == "unlock" and locked:
            cache.unlock(locked.pop(n % len(locked)))
        elif op == "evict":
            want = _lru_scan_order(cache, n)
            freed_slots.clear()
            assert cache.evict(n) == sum(len(s) for s in want)
            assert freed_slots == want
        cache.check_integrity()


def test_eviction_heap_stays_a_few_entries_per_node_when_nothing_is_evicted():
    """Every unlock queues its leaf again and only eviction pops: a server whose pool never fills
    must not grow the heap by one entry per request for ever."""
    cache = _cache_of(64)
    _insert(cache, [1, 2])
    _insert(cache, [3])
    for _ in range(1000):
        match = cache.match_prefix([1, 2], 2)
        cache.lock(match.node)
        cache.unlock(match.node)
    assert len(cache._lru) <= 4 * 2 + 64 + 1
    cache.check_integrity()
    assert cache.evict(1) == 1 and cache.peek_prefix_len([3], 1) == 0  # [3] was used least recently


def test_shared_prefix_is_reused_logged_and_gives_the_cache_off_greedy_output(tiny_checkpoint, tmp_path):
    system, tails = _prompt(48, 1), [_prompt(6, s) for s in (2, 3, 4)]
    outputs = {}
    for cache_on in (True, False):
        run = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / f"log-{cache_on}", chunked_prefill_size=CHUNK,
                              disable_radix_cache=not cache_on)
        reqs = []
        for i, tail in enumerate(tails):
            reqs.append(run.submit(system + tail, f"r{i}", max_new_tokens=6, return_logprob=True))
            run.drain()  # one at a time: each finds its predecessors' committed KV in the tree
        outputs[cache_on] = [r.output_ids for r in reqs]
        cached = [r.state.cached_tokens for r in reqs]
        first_commit = [next(rec for rec in run.records(r.rid) if rec.kind is Kind.COMMIT).payload for r in reqs]
        if cache_on:
            assert cached == [0, 48, 48], cached
            assert [p.get("pc", 0) for p in first_commit] == cached  # the log says what was reused
            assert [run.rebuilt(r.rid).cached_tokens for r in reqs] == cached
            assert run.sched.counters.prefix_hit_tokens == 96
        else:
            assert cached == [0, 0, 0] and run.sched.kv_cached_tokens == 0
        run.sched.check_integrity()
        run.close()
    assert outputs[True] == outputs[False]  # I8: the cache changes what is computed, not the result


def test_only_committed_kv_enters_the_tree_when_a_pending_final_chunk_is_aborted(rt):
    victim = drive_to_final_chunk_pending(rt, "victim")  # chunks 16 + 16 commit; the final 8 is pending
    assert victim.state.kv_committed_len == 32 and victim.inflight_batches == 1
    rt.abort("victim")
    rt.drain()  # the final chunk's result is discarded; its KV was written but never committed
    assert victim.state.kv_committed_len == 32
    assert rt.sched.kv_cached_tokens == 32, "the tree holds more than the victim's committed KV"
    follower = rt.submit(victim.prompt_ids, "follower", max_new_tokens=4)
    rt.drain()
    assert follower.cached_len == follower.state.cached_tokens == 32  # never the discarded chunk's slots


def test_an_aborted_request_releases_its_lock_on_the_matched_prefix(rt):
    system = _prompt(40, 5)
    rt.submit(system + [1, 2], "first", max_new_tokens=3)
    rt.drain()
    second = rt.submit(system + [3, 4], "second", max_new_tokens=50)
    rt.step()
    rt.step()
    assert second.cached_len == 40 and rt.sched.cache.num_locked_tokens >= 40
    rt.abort("second")
    rt.drain()
    assert rt.sched.cache.num_locked_tokens == 0
    assert rt.sched.flush_cache() and rt.sched.kv_pool.num_free == rt.sched.kv_pool.capacity


def test_admission_evicts_unlocked_cache_to_fit_and_keeps_a_live_requests_prefix(tiny_checkpoint, tmp_path):
    rt = ScriptedRuntime(tiny_checkpoint("llama"), tmp_path / "log", chunked_prefill_size=CHUNK, max_total_tokens=200)
    try:
        system = _prompt(60, 9)
        rt.submit(system + [1], "seed", max_new_tokens=2)
        rt.drain()
        holder = rt.submit(system + [2], "holder", max_new_tokens=80)  # locks the 60-token prefix
        rt.step()
        for i in range(4):  # distinct prompts whose KV fills the rest of the pool once finished
            rt.submit(_prompt(30, 20 + i), f"filler{i}", max_new_tokens=2)
            for _ in range(3):
                rt.step()
                rt.sched.check_integrity()
        late = rt.submit(_prompt(50, 40), "late", max_new_tokens=10)  # fits only by evicting fillers
        rt.drain()
        assert late.state.finish_reason is not None and late.output_ids, "admission did not evict to make room"
        assert holder.cached_len == 60 and len(holder.output_ids) == 80
        assert rt.sched.cache.match_prefix(system, max_len=60).length == 60  # the locked prefix survived
        rt.sched.check_integrity()
        assert rt.sched.kv_live_tokens == 0
    finally:
        rt.close()


def test_a_prompt_logprobs_request_recomputes_every_position_it_scores(rt):
    prompt = _prompt(30, 6)
    rt.submit(prompt, "warm", max_new_tokens=2)
    rt.drain()
    reusing = rt.submit(prompt, "reusing", max_new_tokens=1, return_logprob=True)
    scoring = rt.submit(prompt, "scoring", max_new_tokens=1, return_logprob=True, logprob_start_len=0)
    rt.drain()
    assert reusing.cached_len == 29  # output logprobs only: all but the last prompt token reused
    assert scoring.cached_len == 0 and len(scoring.state.input_logprobs) == 29  # every scored position computed


def test_a_prompt_is_shared_once_its_prefill_commits_while_its_request_still_decodes(rt):
    system = _prompt(48, 11)
    first = rt.submit(system + [1], "first", max_new_tokens=40)
    while first.state.kv_committed_len < first.prompt_len:
        rt.step()
    rt.step()  # the committed prompt is adopted by the tree, locked by the live request
    assert not first.is_finished and first.owned_len == first.prompt_len
    second = rt.submit(system + [2], "second", max_new_tokens=4)
    rt.drain()
    assert second.cached_len == 48 and not first.cached_len
    assert len(first.output_ids) == 40


def test_requests_arriving_together_with_a_shared_prefix_compute_it_once(rt):
    system = _prompt(100, 12)
    reqs = [rt.submit(system + [i + 1], f"r{i}", max_new_tokens=3) for i in range(4)]
    rt.drain()
    assert [r.cached_len for r in reqs] == [0, 100, 100, 100]  # the others waited for the first prefill
    prefilled = sum(sum(b.extend_lens) for b in rt.launched if b.mode is ForwardMode.EXTEND)
    assert prefilled == 101 + 3  # the shared 100 tokens were computed once, not four times
