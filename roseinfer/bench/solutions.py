"""Solutions of the notebooks' exercises (roseinfer.bench.exercises checks them). Try first."""

from __future__ import annotations

import hashlib


def kv_cache_attention(cache, x, project, scale):
    """Notebook 01: project the new token alone, keep its key and value, attend over everything kept."""
    import torch

    q, k, v = project(x[None])  # [1, D] each: this token only
    if cache:
        k, v = torch.cat([cache["k"], k]), torch.cat([cache["v"], v])
    cache["k"], cache["v"] = k, v  # every token's, so far
    return torch.softmax(k @ q[0] * scale, dim=0) @ v


def prefix_router(prompt: str, replicas: list[str]) -> str:
    """Notebook 13: hash what is shared (the system prompt, before "\\nUser:"), so it always lands on one replica.
    A stable hash (not Python's `hash`, salted per process) keeps the choice across gateway restarts."""
    system = prompt.split("\nUser:")[0]
    return replicas[int(hashlib.sha256(system.encode()).hexdigest(), 16) % len(replicas)]


def gqa_decode(q, k, v, scale):
    """Notebook 14: give every KV head to its `group` consecutive query heads, then ordinary attention."""
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [tokens, heads, D]
    weights = ((k * q).sum(-1) * scale).softmax(dim=0)  # [tokens, heads]: each head's softmax over the tokens
    return (weights[..., None] * v).sum(0)


def get_generated_ids(scheduler, request_id):
    """Notebook 06: the request's output ids, copied: the caller owns the list, the scheduler keeps its own.
    `scheduler._requests[request_id]` raises KeyError for an unknown id, as the scheduler's accessors do."""
    return list(scheduler._requests[request_id].output_token_ids)
