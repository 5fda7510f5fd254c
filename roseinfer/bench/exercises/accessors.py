"""Notebook 06's exercises: the scheduler's get_generated_ids and pop_response, written from outside."""

from __future__ import annotations

from collections.abc import Callable


class _StandIn:
    """A scheduler stepped without a model, as engine.step would step it: request `rid`'s n-th sampled token is
    `base[rid] + n`. The method the reader writes (`forbidden`) raises `refusal` on it: an answer must not call
    the scheduler's own."""

    def __init__(self, forbidden: str, refusal: type[Exception], requests: dict[int, tuple[list[int], int, str | None]],
                 base: dict[int, int]) -> None:
        from roseinfer.config import SchedulerLimits
        from roseinfer.engine.block_manager import BlockManager
        from roseinfer.engine.scheduler import OnlineScheduler
        from roseinfer.engine.sequence import Request
        from roseinfer.sampling import SamplingParams

        def refuse(self, *args, **kwargs):
            raise refusal

        scheduler_cls = type("Scheduler", (OnlineScheduler,), {forbidden: refuse})
        self.scheduler = scheduler_cls(BlockManager(16, 4), SchedulerLimits(enable_prefix_cache=False), frozenset())
        for rid, (prompt, new_tokens, text) in requests.items():
            params = SamplingParams(max_new_tokens=new_tokens, stop_on_eos=False)
            self.scheduler.add_request(Request(prompt, params, prompt=text), request_id=rid)
        self.base, self.made = base, {rid: [] for rid in requests}  # made: every token sampled, per request

    def step(self) -> None:
        batch = self.scheduler.schedule()
        sampled = [self.base[seq.request_id] + len(self.made[seq.request_id]) if entry.sample else None
                   for (seq, _), entry in zip(batch.scheduled, batch.entries)]
        for (seq, _), token in zip(batch.scheduled, sampled):
            if token is not None:
                self.made[seq.request_id].append(token)
        self.scheduler.update(batch, sampled)


def _unknown_id(call: Callable, unknown: int, passed: str, refusal: type[Exception]) -> str:
    """The last test of both checks: an id the scheduler never saw must raise KeyError."""
    try:
        stray = call(unknown)
    except KeyError:
        return passed
    except (NotImplementedError, refusal):
        raise
    except Exception as exc:
        return f"FAIL: an unknown request id raised {type(exc).__name__}; the scheduler's accessors raise KeyError"
    return (f"FAIL: request {unknown} does not exist, yet it returned {stray!r}: raise KeyError, as the scheduler's "
            "accessors do, so that a wrong id is an error and not an answer")


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
    a, b, unknown = 7, 3, 5  # ids that are not positions: a list index in place of a lookup shows
    prompts = {a: [1, 2, 3], b: [4, 5, 6, 7, 8]}
    stand_in = _StandIn("get_generated_ids", _CalledTheAccessor, {rid: (p, 8, None) for rid, p in prompts.items()},
                        {a: 100, b: 200})
    scheduler, made, step = stand_in.scheduler, stand_in.made, stand_in.step
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
    return _unknown_id(lambda rid: get_ids(scheduler, rid), unknown,
                       "PASS: each request's own generated ids, in a list the caller may change without touching the "
                       "scheduler, read afresh at each call; an unknown id raises KeyError", _CalledTheAccessor)


class _CalledPopResponse(Exception):
    """Raised by check_pop_response's scheduler when an answer calls the method it was asked to write."""


def check_pop_response(pop: Callable) -> str:
    """Notebook 06: `pop(scheduler, request_id)` is the scheduler's `pop_response`, written from outside, the call
    the manager's `_pop_finished` now makes. For a finished request it must return a `FinishedRequest` with that
    request's id, prompt text, prompt ids, generated ids (a list of its own, not the request's), finish reason and
    metrics, and forget the request (the scheduler no longer holds it); a request still running raises ValueError
    and stays; an unknown id raises KeyError, as the scheduler's accessors do.

    The scheduler here runs without a model (the check samples each request's tokens itself: 100, 101, ... for
    the short request, 200, 201, ... for the long one), and has no `pop_response` of its own to call."""
    try:
        return _check_pop_response(pop)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your pop_response"
    except _CalledPopResponse:
        return ("FAIL: it called the scheduler's own pop_response: write that method's body, reading the request "
                "from scheduler._requests")


def _check_pop_response(pop: Callable) -> str:
    from roseinfer.engine.sequence import FinishedRequest

    short, long, unknown = 7, 3, 5  # ids that are not positions
    prompts = {short: [1, 2, 3], long: [4, 5, 6, 7, 8]}
    texts = {short: "a short one", long: "a long one"}
    stand_in = _StandIn("pop_response", _CalledPopResponse,
                        {short: (prompts[short], 2, texts[short]), long: (prompts[long], 8, texts[long])},
                        {short: 100, long: 200})
    scheduler, made, step = stand_in.scheduler, stand_in.made, stand_in.step
    while not scheduler._requests[short].is_finished:
        step()
    seq = scheduler._requests[short]
    out = pop(scheduler, short)
    if not isinstance(out, FinishedRequest):
        return f"FAIL: expected a FinishedRequest (roseinfer.engine.sequence), got {type(out).__name__}"
    if out.request_id != short:
        return f"FAIL: asked for request {short}, the record says request {out.request_id}"
    if out.token_ids == made[long]:
        return f"FAIL: asked for request {short}, it returned request {long}'s tokens: look the request up by its id"
    if out.token_ids == prompts[short] + made[short]:
        return "FAIL: token_ids came with the prompt: the generated ids are the request's output_token_ids alone"
    if out.token_ids != made[short]:
        return f"FAIL: request {short} generated {made[short]}, its record says {out.token_ids}"
    if out.token_ids is seq.output_token_ids:
        return "FAIL: token_ids is the request's own list: hand out a copy (list(...)), as the accessors do"
    if (out.prompt, out.prompt_token_ids) != (texts[short], prompts[short]):
        return "FAIL: the record's prompt or prompt_token_ids are not the request's own"
    if out.finish_reason != seq.finish_reason:
        return f"FAIL: the request finished with {seq.finish_reason!r}, the record says {out.finish_reason!r}"
    if out.metrics is not seq.metrics:
        return "FAIL: the record's metrics are not the request's own (seq.metrics)"
    if short in scheduler._requests:
        return (f"FAIL: the scheduler still holds request {short} after it was popped: forget it "
                "(del scheduler._requests[request_id]), or every finished request stays in memory")
    try:
        early = pop(scheduler, long)
    except ValueError:
        early = None
    except (NotImplementedError, _CalledPopResponse):
        raise
    except Exception as exc:
        return f"FAIL: popping a running request raised {type(exc).__name__}; pop_response raises ValueError"
    if long not in scheduler._requests:
        return (f"FAIL: request {long} was still running, and it was forgotten: check is_finished first, then "
                "forget")
    if early is not None:
        return (f"FAIL: request {long} is still running, yet it returned a record: raise ValueError, so that a "
                "running request cannot be taken out")
    while scheduler.has_unfinished():
        step()
    late = pop(scheduler, long)
    if not isinstance(late, FinishedRequest) or late.token_ids != made[long] or long in scheduler._requests:
        return f"FAIL: once request {long} finished, its record should carry {made[long]} and the scheduler forget it"
    return _unknown_id(lambda rid: pop(scheduler, rid), unknown,
                       "PASS: the finished request's ids (its own copy), prompt, reason and metrics, and the scheduler "
                       "forgets it; a running request raises ValueError and stays; an unknown id raises KeyError",
                       _CalledPopResponse)
