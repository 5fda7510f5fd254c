"""The KV cache as a pool of fixed-size blocks, with a prefix cache.

The engine preallocates one KV tensor with room for `num_blocks` blocks of
`block_size` tokens; this class only does the bookkeeping of who holds which
block:

- a reference count per block (a block can be shared by several requests when
  they start with the same tokens);
- a free list of blocks that hold nothing worth keeping;
- the prefix cache: a full block is registered under a chained hash of every
  token up to and including it, so a later request with the same prefix finds
  it and shares it instead of recomputing it. A cached block whose last user
  has finished is not freed but kept "evictable", least recently used first,
  and is only reclaimed when the free list is empty.

It knows nothing about requests: callers hand it block tables (lists of block
ids) and tokens.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence


def chain_hash(parent: int | None, block_tokens: Sequence[int]) -> int:
    """Hash of a full block that also covers every block before it (via `parent`)."""
    return hash((parent, tuple(block_tokens)))


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; LRU first
        self._hash_of_block: dict[int, int] = {}
        self._tokens_of_block: dict[int, tuple[int, ...]] = {}  # checked on a hit: no false sharing
        self._block_of_hash: dict[int, int] = {}

    # -- accounting ---------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (free, or cached but unreferenced)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._block_of_hash)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    # -- allocation ---------------------------------------------------------------
    def can_allocate(self, num_blocks: int, reusing: Sequence[int] = ()) -> bool:
        """Whether `num_blocks` new blocks fit after taking the cached blocks `reusing`."""
        revived = sum(1 for b in reusing if self._ref_counts[b] == 0)
        return num_blocks + revived <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: asked {num_blocks}, {self.num_free_blocks} free")
        return [self._take_block() for _ in range(num_blocks)]

    def _take_block(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:  # reclaim the least recently used cached block
            block, _ = self._evictable.popitem(last=False)
            self._forget_hash(block)
        self._ref_counts[block] = 1
        return block

    def share(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cached blocks found by `match_prefix`."""
        for block in block_ids:
            if self._ref_counts[block] == 0:
                del self._evictable[block]
            self._ref_counts[block] += 1

    def free(self, block_table: Sequence[int]) -> None:
        """Drop one reference on each block; the table's tail becomes the first to be evicted."""
        for block in reversed(block_table):
            self._ref_counts[block] -= 1
            if self._ref_counts[block] > 0:
                continue
            if block in self._hash_of_block:
                self._evictable[block] = None
            else:
                self._free.append(block)

    # -- prefix cache -------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int], max_tokens: int) -> tuple[list[int], list[int]]:
        """Cached blocks covering the longest block-aligned prefix of token_ids[:max_tokens].

        Returns (block ids, their chained hashes). Takes no reference: call `share`.
        """
        blocks: list[int] = []
        hashes: list[int] = []
        parent = None
        size = self.block_size
        for start in range(0, max_tokens - size + 1, size):
            chunk = tuple(token_ids[start : start + size])
            h = chain_hash(parent, chunk)
            block = self._block_of_hash.get(h)
            if block is None or self._tokens_of_block[block] != chunk:
                break
            blocks.append(block)
            hashes.append(h)
            parent = h
        return blocks, hashes

    def register(self, block_id: int, block_hash: int, block_tokens: Sequence[int]) -> None:
        """Make a full, computed block findable by its hash (first writer wins)."""
        if block_hash in self._block_of_hash or block_id in self._hash_of_block:
            return
        self._block_of_hash[block_hash] = block_id
        self._hash_of_block[block_id] = block_hash
        self._tokens_of_block[block_id] = tuple(block_tokens)

    def _forget_hash(self, block_id: int) -> None:
        h = self._hash_of_block.pop(block_id, None)
        if h is not None:
            del self._block_of_hash[h]
            del self._tokens_of_block[block_id]

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that nobody holds (e.g. between benchmark runs)."""
        for block in list(self._evictable):
            self._forget_hash(block)
            self._free.append(block)
        self._evictable.clear()
