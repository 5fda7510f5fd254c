"""Notebook 08's exercise: one sequence's decode attention read through its block table."""

from __future__ import annotations

from collections.abc import Callable


def _paged_reference(q, k_cache, v_cache, table, context_len: int, scale: float):
    """One sequence's decode attention by the gather + SDPA path (notebook 08's "before")."""
    import torch

    from roseinfer.attention.base import AttentionMetadata
    from roseinfer.bench.paged_attention import gather_attention

    meta = AttentionMetadata(slot_mapping=torch.full((1,), -1), block_tables=table[None],
                             context_lens=torch.tensor([context_len], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, 1], dtype=torch.int32), max_query_len=1,
                             max_context_len=context_len)
    return gather_attention(q[None], k_cache, v_cache, meta, scale)[0]


def _paged_weights(scores, block_size: int, rescale: bool = True, normalize: bool = True):
    """Softmax weights of each head's scores [H, n], accumulated a block at a time as an online softmax does; with
    rescale=False, the mistake of never rescaling what earlier blocks added when the maximum grows."""
    import torch

    heads, n = scores.shape
    running = torch.full((heads,), float("-inf"), dtype=scores.dtype)
    weights = torch.zeros_like(scores)
    total = torch.zeros(heads, dtype=scores.dtype)
    for start in range(0, n, block_size):
        block = scores[:, start:start + block_size]
        new = torch.maximum(running, block.max(dim=1).values)
        if rescale:
            weights *= torch.exp(running - new)[:, None]
            total *= torch.exp(running - new)
        weights[:, start:start + block_size] = torch.exp(block - new[:, None])
        total += weights[:, start:start + block_size].sum(dim=1)
        running = new
    return weights / total[:, None] if normalize else weights


def _call_paged(attend, case) -> tuple:
    """(output as float32, None) or (None, the FAIL line) for one call of the reader's function."""
    import torch

    q, k_cache, v_cache, table, context_len, scale = case
    try:
        out = attend(q, k_cache, v_cache, table, context_len, scale)
    except NotImplementedError:
        raise
    except IndexError as exc:
        return None, (f"FAIL: IndexError ({exc}): an index past a block or past the table. Token t of the sequence "
                      "lies in block block_table[t // block_size], slot t % block_size")
    except Exception as exc:
        return None, f"FAIL: it raised {type(exc).__name__}: {exc}"
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
        got = getattr(out, "shape", type(out))
        return None, f"FAIL: expected a tensor of shape {tuple(q.shape)} ([H, D]), got {got}"
    return out.float(), None


def _paged_probe(attend) -> str | None:
    """Values that say which slot they came from: V of slot j is the j-th unit vector (the same for every head), so
    out[h, j] is the weight head h gave slot j. The keys make each head's scores rise token by token (the maximum
    grows from block to block), and the table has one entry more than the context needs."""
    import torch

    heads, block_size, num_blocks, table, n = 3, 4, 8, [5, 2, 6, 0], 10
    dim = num_blocks * block_size
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(heads, dim, generator=gen)
    k_cache = torch.randn(num_blocks, block_size, heads, dim, generator=gen)
    slots = [table[t // block_size] * block_size + t % block_size for t in range(n)]  # token t's slot
    for t, slot in enumerate(slots):  # score of token t rises by about 0.35 t
        k_cache.view(-1, heads, dim)[slot] += 2.0 * t * q / (q * q).sum(dim=1, keepdim=True)
    v_cache = torch.eye(dim).view(num_blocks, block_size, 1, dim).expand(-1, -1, heads, -1).contiguous()
    scale = dim**-0.5
    out, fail = _call_paged(attend, (q, k_cache, v_cache, torch.tensor(table, dtype=torch.int32), n, scale))
    if fail:
        return fail
    if not torch.isfinite(out).all():
        return ("FAIL: NaN or inf in the output, with scores of a few units: look at the first block (with the "
                "running maximum at -inf, exp(-inf - m) is 0 but -inf - (-inf) is NaN) and at the final division")
    keys = k_cache.view(-1, heads, dim)[slots]  # [n, H, D]: the context's keys, token by token
    owned = torch.zeros(dim, dtype=torch.bool)
    owned[slots] = True
    stray = out[:, ~owned].abs().sum(dim=1).max().item()
    if stray > 1e-3:
        last = table[(n - 1) // block_size] * block_size
        beyond = set(range(last + n % block_size, last + block_size)) if n % block_size else set()
        beyond |= {b * block_size + s for b in table[-(-n // block_size):] for s in range(block_size)}
        read = {j for j in range(dim) if not owned[j] and out[:, j].abs().max() > 1e-4}
        if read <= beyond and bool((out[:, slots].abs() > 1e-6).all()):  # every token read, and more
            return (f"FAIL: with context_len {n} and blocks of {block_size}, it read slots past the context (the end "
                    f"of the last block, or table entries after it): read {-(-n // block_size)} blocks, and only "
                    f"{n - (-(-n // block_size) - 1) * block_size} tokens of the last")
        if {j for j in range(dim) if out[:, j].abs().max() > 1e-4} == set(range(n)):  # token t from slot t
            return ("FAIL: it read blocks 0, 1, 2, ... of the cache, not the sequence's: the physical block of token "
                    "t is block_table[t // block_size]")
        return (f"FAIL: it read slots that hold none of this sequence's tokens (weight {stray:.2f} on them): wrong "
                "block/slot arithmetic; token t lies in block block_table[t // block_size], slot t % block_size")
    weights = out[:, slots]  # [H, n]
    own = torch.einsum("hd,nhd->hn", q, keys) * scale
    if torch.allclose(weights, _paged_weights(own, block_size), atol=1e-4):
        return None
    tail = n % block_size
    if tail and weights[:, -tail:].abs().max() < 1e-6:
        return (f"FAIL: the last {tail} tokens got no weight: the last block is only partly full; read "
                "ceil(context_len / block_size) blocks")
    sums = out.sum(dim=1)
    if (sums - 1).abs().max() > 1e-3:
        return (f"FAIL: each head's weights sum to {sums.tolist()[0]:.3g}, not 1: divide the accumulator by the "
                "running sum of the exponentials at the end")
    for h in range(heads):
        for g in range(heads):
            other = _paged_weights(torch.einsum("d,nd->n", q[h], keys[:, g])[None] * scale, block_size)[0]
            if g != h and torch.allclose(weights[h], other, atol=1e-4):
                return (f"FAIL: mixing up heads: query head {h} scored head {g}'s keys; head h reads "
                        "k_cache[block, slot, h] only")
    summed = _paged_weights(torch.einsum("hd,nhd->n", q, keys)[None] * scale, block_size)
    if torch.allclose(weights, summed.expand(heads, -1), atol=1e-4):
        return ("FAIL: mixing up heads: every head got the same weights, its scores summed over all heads; each head "
                "scores its own query against its own keys")
    for wrong, why in ((1.0, "without the scale"), (scale**2, "with the scale applied twice")):
        if torch.allclose(weights, _paged_weights(own / scale * wrong, block_size), atol=1e-4):
            return f"FAIL: the scores were taken {why}: softmax(q . k x scale), the scale once"
    if torch.allclose(weights, _paged_weights(own, block_size, rescale=False), atol=1e-4) or torch.allclose(
            weights, _paged_weights(own, 1, rescale=False), atol=1e-4):
        return ("FAIL: what earlier tokens added was not rescaled when the running maximum grew: multiply the running "
                "sum and the accumulator by exp(old max - new max) before adding the new block")
    off = (weights - _paged_weights(own, block_size)).abs().max()
    return f"FAIL: each slot was read right, but the weights are off by {off:.3g} from the softmax of q . k x scale"


def check_paged_decode(attend: Callable) -> str:
    """Notebook 08: `attend(q, k_cache, v_cache, block_table, context_len, scale)` is one sequence's decode attention
    read through its block table: q [H, D]; caches [num_blocks, block_size, H, D]; block_table a 1-D int tensor whose
    entry j is the physical block of the sequence's tokens j * block_size .. (j + 1) * block_size - 1 (it may have
    entries past the context: ignore them); context_len the tokens cached. It must return [H, D]: each head's query
    over its own head's keys and values of tokens 0 .. context_len - 1, as the gather + SDPA path gives.

    Three checks: a probe whose values say which slots were read and with what weight (block and slot arithmetic,
    the context's end, heads, the softmax); random caches with poison in every slot the sequence does not own, at
    contexts of 1, one block, two and 13 tokens; a score of 2000 (exp overflows without the maximum subtracted, even
    in float64). It cannot tell an online softmax from one taken over all the scores at once: that part is yours."""
    import torch

    try:
        fail = _paged_probe(attend)
        if fail:
            return fail
        heads, dim, block_size = 4, 8, 4
        gen = torch.Generator().manual_seed(1)
        for n in (1, block_size, 2 * block_size, 13):
            table = torch.randperm(12, generator=gen)[: -(-n // block_size) + 2].to(torch.int32)  # 2 spare entries
            k_cache, v_cache = (torch.randn(12, block_size, heads, dim, generator=gen) for _ in range(2))
            owned = torch.zeros(12, block_size, dtype=torch.bool)
            for t in range(n):
                owned[table[t // block_size], t % block_size] = True
            k_cache[~owned] = 1e4  # poison: a slot read that no token owns wrecks the answer
            v_cache[~owned] = 1e4
            case = (torch.randn(heads, dim, generator=gen), k_cache, v_cache, table, n, dim**-0.5)
            out, fail = _call_paged(attend, case)
            if fail:
                return fail
            expected = _paged_reference(*case)
            if torch.allclose(out, expected, atol=1e-4):
                continue
            q = case[0]
            keys, values = (c.view(-1, heads, dim)[[int(table[t // block_size]) * block_size + t % block_size
                                                     for t in range(n)]] for c in (k_cache, v_cache))
            for h in range(heads):
                for g in range(heads):
                    w = torch.softmax(keys[:, h] @ q[h] * dim**-0.5, dim=0)
                    if g != h and torch.allclose(out[h], w @ values[:, g], atol=1e-4):
                        return (f"FAIL: mixing up heads: head {h}'s weights were applied to head {g}'s values; head h "
                                "reads v_cache[block, slot, h]")
                    w = torch.softmax(keys[:, g] @ q[h] * dim**-0.5, dim=0)
                    if g != h and torch.allclose(out[h], w @ values[:, g], atol=1e-4):
                        return (f"FAIL: mixing up heads: query head {h} read head {g}'s keys and values; head h "
                                "reads k_cache[block, slot, h] and v_cache[block, slot, h]")
            return (f"FAIL: context_len {n} (blocks of {block_size}): off by {(out - expected).abs().max():.3g} from "
                    "the gather + SDPA reference")
        heads, dim = 2, 8
        q, k_cache = torch.randn(heads, dim, generator=gen) * 10, torch.randn(6, block_size, heads, dim, generator=gen)
        v_cache, table, scale = torch.randn(6, block_size, heads, dim, generator=gen), [3, 1, 4], dim**-0.5
        k_cache[1, 2] = q * (2000 / scale) / (q * q).sum(dim=1, keepdim=True)  # token 6's score: 2000, every head
        case = (q, k_cache, v_cache, torch.tensor(table, dtype=torch.int32), 11, scale)
        out, fail = _call_paged(attend, case)
        if fail:
            return fail
        if not torch.isfinite(out).all():
            return ("FAIL: overflow: with a score of 2000, exp(score) is inf (in float64 too) and the output NaN: "
                    "subtract each head's running maximum before exp, and rescale when it grows")
        if not torch.allclose(out, _paged_reference(*case), atol=1e-4):
            return (f"FAIL: with a score of 2000 among scores of about 10 the output is off by "
                    f"{(out - _paged_reference(*case)).abs().max():.3g} (it should be that token's value)")
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your attention"
    return ("PASS: every token read through the block table, nothing past the context, each head on its own keys and "
            "values, no overflow at a score of 2000; equal to the gather + SDPA reference")
