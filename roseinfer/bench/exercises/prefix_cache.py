"""Notebook 10's exercise: the prefix cache's lookup of a prompt's cached blocks."""

from __future__ import annotations

from collections.abc import Callable


def _prefix_cache_case():
    """check_prefix_blocks's cache, made the engine's way (BlockManager.register under chain_hash), blocks of 4.

    Traps, each a physical block the answer must not contain: 9 holds tokens 9..12 cached as a prompt's FIRST block
    (found by a key without its parent, or past a miss); 4 and 11 follow 1..4 | 5..8 | 17..20, whose third block was
    evicted (found only past a miss); 6 and 8 hold partial blocks (found only by looking one up)."""
    from roseinfer.engine.block_manager import BlockManager, chain_hash

    a, b, c, d, e, f, g = (tuple(range(4 * i + 1, 4 * i + 5)) for i in range(7))  # 1..4, 5..8, ..., 25..28
    manager = BlockManager(16, 4)

    def register(blocks, ids, skip=()):  # chained as OnlineScheduler._register_full_blocks does
        parent = None
        for tokens, block in zip(blocks, ids):
            parent = chain_hash(parent, tokens)
            if block not in skip:
                manager.register(block, parent, tokens)

    register([a, b, c, d], [7, 3, 12, 5])
    register([c], [9])
    register([a, b, e, f, g], [7, 3, 13, 4, 11], skip={13})  # block 13 (tokens 17..20) evicted since
    register([a, b, (40, 41)], [7, 3, 6])
    register([a, b, (40, 41, 42)], [7, 3, 8])
    prompts = {  # name: (prompt, trap blocks: the mistake that takes them)
        "tokens 1..4, 9..12, 60": ([*a, *c, 60], {9: "unchained"}),
        "4 cached blocks + 2 own tokens": ([*a, *b, *c, *d, 50, 51], {}),
        "exactly 4 cached blocks": ([*a, *b, *c, *d], {5: "last token"}),
        "2 cached blocks, an evicted one, 2 more": ([*a, *b, *e, *f, *g, 61], {4: "past a miss", 11: "past a miss"}),
        "2 cached blocks + 3 own tokens": ([*a, *b, 40, 41, 42], {6: "partial", 8: "partial"}),
        "an uncached first block": ([70, 71, 72, 73, *c, *d, 62], {9: "past a miss"}),
        "tokens 9..12 first, as cached": ([*c, *d, 63], {}),
        "3 tokens": ([*a[:3]], {}),
    }
    cases = [(name, prompt, manager.match_prefix(prompt, len(prompt) - 1)[0], traps)
             for name, (prompt, traps) in prompts.items()]
    return cases, dict(manager._block_of_hash)


_PREFIX_MISTAKES = {
    "unchained": ("FAIL: hashing a block without its parent: in '{name}' block {block} was taken, cached as some "
                  "prompt's first block; equal tokens after a different prefix have other keys and values. A block's "
                  "key is chain_hash(key of the block before it, or None for the first, its tokens)"),
    "past a miss": ("FAIL: not stopping at the first miss: in '{name}' block {block} comes after a block that is not "
                    "cached; the cached prefix ends at the first block not found (the rest, from there, is computed)"),
    "partial": ("FAIL: matching a partial last block: in '{name}' block {block} holds fewer than block_size tokens; "
                "only full blocks are cached, so look up full blocks only"),
    "last token": ("FAIL: the whole prompt came from the cache in '{name}': leave its last token out of the lookup "
                   "(its logits give the first new token), so a prompt of whole blocks reuses all but the last"),
}


def check_prefix_blocks(match: Callable) -> str:
    """Notebook 10: `match(token_ids, block_size, cached)` is admission's prefix-cache lookup, the engine's
    BlockManager.match_prefix as OnlineScheduler._admit calls it. `cached` maps a full block's key,
    chain_hash(the key of the block before it, or None for the first, its tokens), to its physical block. It must
    return the physical blocks of the longest run of full blocks, from the prompt's start, found in `cached`,
    looking up every token but the last (its logits give the first new token). Checked against match_prefix on a
    cache with traps: a block cached after another prefix, blocks after an evicted one, partial blocks."""
    cases, cached = _prefix_cache_case()
    for name, prompt, expected, traps in cases:
        try:
            got = match(list(prompt), 4, dict(cached))
        except NotImplementedError:
            return "not written yet: replace the `raise NotImplementedError` with your lookup"
        except Exception as exc:
            return f"FAIL: '{name}': it raised {type(exc).__name__}: {exc}"
        if not isinstance(got, (list, tuple)) or not all(isinstance(x, int) for x in got):
            return f"FAIL: '{name}': expected a list of physical block ids (ints), got {got!r}"
        got = list(got)
        if got == expected:
            continue
        if any(x in cached for x in got):
            return f"FAIL: '{name}': it returned keys; return the physical blocks they map to (cached[key])"
        if got == list(range(len(got))) and got != expected[: len(got)]:
            return (f"FAIL: '{name}': got {got}, the blocks' positions in the prompt; return the physical blocks "
                    "(cached[key])")
        for block in got:
            if block in traps and block not in expected:
                return _PREFIX_MISTAKES[traps[block]].format(name=name, block=block)
        if got == expected[: len(got)]:
            k = len(got)
            return (f"FAIL: '{name}': stopped after {k} block(s), expected {expected}: block {k} (tokens "
                    f"{prompt[4 * k:4 * k + 4]}) is cached under chain_hash(key of block {k - 1}, its tokens)"
                    if k else f"FAIL: '{name}': found nothing, expected {expected}: block 0 (tokens {prompt[:4]}) is "
                    "cached under chain_hash(None, its tokens)")
        return f"FAIL: '{name}': got {got}, expected {expected}"
    return (f"PASS: {len(cases)} prompts, each matched to the engine's match_prefix: chained keys, full blocks only, "
            "stopping at the first miss, the last token left to compute")
