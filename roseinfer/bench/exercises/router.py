"""Notebook 14's exercise: a router that keeps each system prompt on one replica."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

ROUTER_REPLICAS = ["http://replica-1", "http://replica-2"]


def check_prefix_router(route: Callable[[str, list[str]], str]) -> str:
    """Notebook 14: `route(prompt, replicas)` must send prompts with the same system prompt (the text before
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
