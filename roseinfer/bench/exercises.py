"""Checks for the notebooks' write-the-code exercises: each runs the reader's function against a small test and
prints one line, PASS or what failed. The solutions live in `roseinfer.bench.solutions`, out of the notebook."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

ROUTER_REPLICAS = ["http://replica-1", "http://replica-2"]


def check_prefix_router(route: Callable[[str, list[str]], str]) -> str:
    """Notebook 13: `route(prompt, replicas)` must send prompts with the same system prompt (the text before
    "\\nUser:") to the same replica, and spread distinct system prompts over the replicas."""
    systems = [f"System {i}: you answer for shop number {i}." for i in range(16)]
    try:
        chosen = {s: {route(f"{s}\nUser: question {u}?", ROUTER_REPLICAS) for u in range(5)} for s in systems}
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your router"
    if any(len(replicas) > 1 for replicas in chosen.values()):
        return "FAIL: one system prompt went to several replicas (its cached blocks are wasted on all but one)"
    spread = Counter(next(iter(r)) for r in chosen.values())
    if set(spread) - set(ROUTER_REPLICAS):
        return f"FAIL: it answered a replica it was not given: {sorted(set(spread) - set(ROUTER_REPLICAS))}"
    if min(spread.get(r, 0) for r in ROUTER_REPLICAS) < 4:
        return f"FAIL: 16 system prompts split {dict(spread)}: one replica would do all the work"
    return f"PASS: each system prompt sticks to one replica, 16 of them split {sorted(spread.values())}"


def check_gqa_decode(attend: Callable) -> str:
    """Notebook 14: `attend(q, k, v, scale)` with q [heads, D] (one decode token) and k, v [tokens, kv_heads, D]
    must give [heads, D], query head h reading KV head h // (heads // kv_heads), as transformers lays them out."""
    import torch

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, tokens = 9, 3, 8, 5
    q = torch.randn(heads, dim, generator=gen)
    k, v = torch.randn(tokens, kv_heads, dim, generator=gen), torch.randn(tokens, kv_heads, dim, generator=gen)
    group = heads // kv_heads
    expected = torch.stack([torch.softmax(k[:, h // group] @ q[h] * 0.5, 0) @ v[:, h // group] for h in range(heads)])
    interleaved = torch.stack([torch.softmax(k[:, h % kv_heads] @ q[h] * 0.5, 0) @ v[:, h % kv_heads]
                               for h in range(heads)])
    try:
        out = attend(q, k, v, 0.5)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your attention"
    if not isinstance(out, torch.Tensor) or out.shape != (heads, dim):
        return f"FAIL: expected a tensor of shape {(heads, dim)}, got {getattr(out, 'shape', type(out))}"
    if torch.allclose(out, interleaved, atol=1e-5):
        return "FAIL: query head h read KV head h % kv_heads; the heads of a group are consecutive: h // group"
    if not torch.allclose(out, expected, atol=1e-5):
        return f"FAIL: off by {(out - expected).abs().max():.3g} from the reference"
    return f"PASS: {heads} query heads on {kv_heads} KV heads, each reading its group's keys and values"
