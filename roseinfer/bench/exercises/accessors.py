"""Notebook 06's exercise: the scheduler's get_generated_ids, written from outside."""

from __future__ import annotations

from collections.abc import Callable


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
