"""BlockManager bookkeeping: reference counts, free list, prefix hashes, LRU eviction."""

from __future__ import annotations

import pytest

from roseinfer.engine.block_manager import BlockManager, chain_hash


def _register_all(bm, table, tokens):
    parent = None
    for j, block in enumerate(table):
        chunk = tokens[j * bm.block_size : (j + 1) * bm.block_size]
        parent = chain_hash(parent, chunk)
        bm.register(block, parent, chunk)


def test_allocate_and_free_keep_counts():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = bm.allocate(3)
    b = bm.allocate(5)
    assert bm.num_used_blocks == 8 and bm.num_free_blocks == 0
    assert not bm.can_allocate(1)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.allocate(1)
    bm.free(a)
    bm.free(b)
    assert bm.num_used_blocks == 0


def test_prefix_match_shares_blocks_by_reference():
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = list(range(10))
    table = bm.allocate(3)
    _register_all(bm, table[:2], tokens)  # two full blocks, the third is partial
    hits, hashes = bm.match_prefix(tokens, len(tokens) - 1)
    assert hits == table[:2] and len(hashes) == 2
    bm.share(hits)
    assert bm.ref_count(table[0]) == 2
    # Different second block: only the first matches; the chain hash makes position matter.
    assert bm.match_prefix([0, 1, 2, 3, 9, 9, 9, 9], 8)[0] == table[:1]
    assert bm.match_prefix([4, 5, 6, 7], 4)[0] == []
    # max_tokens caps the match to whole blocks inside it.
    assert bm.match_prefix(tokens[:8], 7)[0] == table[:1]
    bm.free(table)
    bm.free(hits)
    assert bm.num_used_blocks == 0
    assert bm.num_cached_blocks == 2  # kept, evictable


def test_uncached_free_blocks_are_used_before_evicting_cached_ones():
    bm = BlockManager(num_blocks=4, block_size=2)
    table = bm.allocate(2)
    _register_all(bm, table, [1, 2, 3, 4])
    bm.free(table)
    fresh = bm.allocate(2)
    assert set(fresh).isdisjoint(table)
    assert bm.num_cached_blocks == 2
    evicting = bm.allocate(1)  # nothing else free: the least recently used cached block goes
    assert evicting == [table[1]]  # the tail of a freed table is evicted first
    assert bm.match_prefix([1, 2, 3, 4], 4)[0] == [table[0]]
    assert bm.num_cached_blocks == 1


def test_reviving_an_evictable_block_counts_against_free_space():
    bm = BlockManager(num_blocks=3, block_size=2)
    table = bm.allocate(2)
    _register_all(bm, table, [5, 6, 7, 8])
    bm.free(table)
    hits, _ = bm.match_prefix([5, 6, 7, 8, 9], 4)
    assert bm.can_allocate(1, reusing=hits)
    assert not bm.can_allocate(2, reusing=hits)


def test_first_writer_wins_for_a_hash():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = bm.allocate(1), bm.allocate(1)
    h = chain_hash(None, [1, 2])
    bm.register(a[0], h, [1, 2])
    bm.register(b[0], h, [1, 2])
    assert bm.match_prefix([1, 2, 3], 2)[0] == a
    bm.free(b)
    assert bm.num_cached_blocks == 1  # b went back to the plain free list
    bm.free(a)
    bm.reset_prefix_cache()
    assert bm.num_cached_blocks == 0 and bm.num_free_blocks == 4
