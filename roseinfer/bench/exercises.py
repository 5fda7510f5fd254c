"""Checks for the notebooks' write-the-code exercises: each runs the reader's function against a small test and
prints one line, PASS or what failed. The solutions live in `roseinfer.bench.solutions`, out of the notebook."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

ROUTER_REPLICAS = ["http://replica-1", "http://replica-2"]


def check_kv_cache_attention(step: Callable) -> str:
    """Notebook 01: `step(cache, x, project, scale)` gets one new token's hidden state x ([E]), a `project`
    that maps rows [n, E] to their (q, k, v), each [n, D], and a `cache` dict (empty at first, kept across
    calls). It must return that token's attention output over every token so far, itself included, and
    project each token once: the keys and values of earlier tokens come from the cache, not recomputed."""
    import torch

    gen = torch.Generator().manual_seed(0)
    tokens, width, dim, scale = 6, 12, 8, 8**-0.5
    xs = torch.randn(tokens, width, generator=gen)
    weights = torch.randn(3, width, dim, generator=gen)
    projected = []

    def project(rows):
        if rows.dim() != 2 or rows.shape[1] != width:
            raise ValueError(f"project takes rows [n, {width}], got {tuple(rows.shape)}")
        projected.append(rows.shape[0])
        return rows @ weights[0], rows @ weights[1], rows @ weights[2]

    q, k, v = (xs @ w for w in weights)
    causal = torch.full((tokens, tokens), float("-inf")).triu(1)
    expected = torch.softmax(q @ k.T * scale + causal, dim=-1) @ v  # row t: token t over tokens 0..t
    cache: dict = {}
    try:
        outs = [step(cache, xs[t], project, scale) for t in range(tokens)]
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your step"
    for t, out in enumerate(outs):
        out = out.reshape(-1) if isinstance(out, torch.Tensor) and out.numel() == dim else out
        if not isinstance(out, torch.Tensor) or out.shape != (dim,):
            return f"FAIL: token {t}: expected a tensor of {dim} values, got {getattr(out, 'shape', type(out))}"
        if not torch.allclose(out, expected[t], atol=1e-5):
            alone = torch.allclose(out, v[t], atol=1e-5)
            hint = " (it attended to the new token alone: keep every token's k and v)" if alone else ""
            return f"FAIL: token {t} is off by {(out - expected[t]).abs().max():.3g} from causal attention{hint}"
    if sum(projected) != tokens:
        return (f"FAIL: right answers, but {sum(projected)} rows projected for {tokens} tokens: earlier tokens' "
                "keys and values were recomputed instead of read from the cache")
    return f"PASS: {tokens} tokens, each projected once, each attending to every cached key and value and itself"


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


class _CalledTheAccessor(Exception):
    """Raised by check_generated_ids's scheduler when an answer calls the accessor it was asked to write."""


def check_generated_ids(get_ids: Callable) -> str:
    """Notebook 06: `get_ids(scheduler, request_id)` is the scheduler's `get_generated_ids`, written from outside.
    It must return that request's generated token ids (its output, not its prompt) as a list the caller owns:
    appending to it leaves the scheduler's request alone, a later call sees the tokens generated since, and an
    unknown id raises KeyError, as the scheduler's own accessors do.

    The scheduler here runs without a model (the check samples each request's tokens itself: 100, 101, ... for
    one request, 200, 201, ... for the other), and has no `get_generated_ids` of its own to call."""
    try:
        return _check_generated_ids(get_ids)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your accessor"
    except _CalledTheAccessor:
        return ("FAIL: it called the scheduler's own get_generated_ids: write that method's body, reading the "
                "request from scheduler._requests")


def _check_generated_ids(get_ids: Callable) -> str:
    from roseinfer.config import SchedulerLimits
    from roseinfer.engine.block_manager import BlockManager
    from roseinfer.engine.scheduler import OnlineScheduler
    from roseinfer.engine.sequence import Request
    from roseinfer.sampling import SamplingParams

    class Scheduler(OnlineScheduler):  # the accessor being written is not there to call
        def get_generated_ids(self, request_id: int) -> list[int]:
            raise _CalledTheAccessor

    scheduler = Scheduler(BlockManager(16, 4), SchedulerLimits(enable_prefix_cache=False), frozenset())
    params = SamplingParams(max_new_tokens=8, stop_on_eos=False)
    a, b, unknown = 7, 3, 5  # ids that are not positions: a list index in place of a lookup shows
    prompts = {a: [1, 2, 3], b: [4, 5, 6, 7, 8]}
    for rid, prompt in prompts.items():
        scheduler.add_request(Request(prompt, params), request_id=rid)
    base, made = {a: 100, b: 200}, {a: [], b: []}  # made: every token the stand-in model sampled, per request

    def step() -> None:  # engine.step with a stand-in for the model
        batch = scheduler.schedule()
        sampled = [base[seq.request_id] + len(made[seq.request_id]) if entry.sample else None
                   for (seq, _), entry in zip(batch.scheduled, batch.entries)]
        for (seq, _), token in zip(batch.scheduled, sampled):
            if token is not None:
                made[seq.request_id].append(token)
        scheduler.update(batch, sampled)

    for _ in range(3):
        step()
    got = {rid: get_ids(scheduler, rid) for rid in (a, b)}
    for rid, other in ((a, b), (b, a)):
        ids = got[rid]
        if not isinstance(ids, list):
            return f"FAIL: expected a list of token ids, as the scheduler's accessor gives, got {type(ids).__name__}"
        if ids == made[other]:
            return (f"FAIL: asked for request {rid}, it returned request {other}'s tokens: look the request up by "
                    "its id")
        if ids == prompts[rid] + made[rid]:
            return f"FAIL: request {rid}'s ids came with its prompt: the generated ids are its output alone"
        if ids == prompts[rid]:
            return f"FAIL: request {rid}'s prompt came back: the generated ids are its output_token_ids"
        if ids != made[rid]:
            return f"FAIL: request {rid} generated {made[rid]}, it returned {ids}"
    got[b].append(-1)  # the caller's own bookkeeping, on the list it was given
    if scheduler._requests[b].output_token_ids != made[b]:
        return ("FAIL: appending to the returned list changed the scheduler's request: that list is the request's "
                "own; return a copy")
    step()
    again = get_ids(scheduler, b)
    if again != made[b]:
        return (f"FAIL: after one more step it returned {again}, where request {b} has generated {made[b]}: read "
                "the request at each call")
    try:
        stray = get_ids(scheduler, unknown)
    except KeyError:
        return ("PASS: each request's own generated ids, in a list the caller may change without touching the "
                "scheduler, read afresh at each call; an unknown id raises KeyError")
    except (NotImplementedError, _CalledTheAccessor):
        raise
    except Exception as exc:
        return f"FAIL: an unknown request id raised {type(exc).__name__}; the scheduler's accessors raise KeyError"
    return (f"FAIL: request {unknown} does not exist, yet it returned {stray!r}: raise KeyError, as the scheduler's "
            "accessors do, so that a wrong id is an error and not an answer")
