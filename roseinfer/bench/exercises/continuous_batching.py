"""Notebook 03's exercise: the continuous-batching decision between two steps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

SCHEDULE_MAX_BATCH_SIZES = (4, 2)


def _schedule_stream() -> list[tuple[int, int, int]]:
    """check_schedule_step's requests: (arrival step, request id, tokens to generate), in arrival order. Bursts
    overfill the batch, a lull lets it drain; the ids are not in arrival order, so a sorted queue (or a set) shows."""
    import random

    rng = random.Random(3)
    arrivals = [0] * 6 + [2, 3, 5, 5, 9, 12] + [30] * 5 + [31, 33, 34, 34, 34, 40, 41, 55, 56, 56, 57, 60, 60]
    ids = rng.sample(range(10, 100), len(arrivals))
    return [(step, rid, rng.randint(1, 8)) for step, rid in zip(arrivals, ids)]


def _schedule_reference(running: list[tuple[int, int]], waiting: list[int], max_batch_size: int):
    finished = [rid for rid, left in running if left == 0]
    free = max_batch_size - (len(running) - len(finished))
    return finished, waiting[: max(free, 0)]


def _schedule_states(max_batch_size: int) -> list[tuple[int, list, list, list, list]]:
    """The reference run, step by step: (step, running, waiting, finished, admitted), the state being what
    schedule_step is called with before that step, and finished, admitted the reference's decision."""
    stream = _schedule_stream()
    lengths = {rid: n for _, rid, n in stream}
    running: list[tuple[int, int]] = []
    waiting: list[int] = []
    states, i, step = [], 0, 0
    while i < len(stream) or running or waiting:
        while i < len(stream) and stream[i][0] <= step:  # arrivals join the queue before the step is decided
            waiting.append(stream[i][1])
            i += 1
        finished, admitted = _schedule_reference(running, waiting, max_batch_size)
        states.append((step, list(running), list(waiting), finished, admitted))
        running = [(r, n) for r, n in running if r not in finished] + [(r, lengths[r]) for r in admitted]
        waiting = waiting[len(admitted):]
        running = [(r, n - 1) for r, n in running]  # the step: one token each (a newcomer's from its prefill)
        step += 1
    return states


def _judge_schedule_step(out, step: int, running: list, waiting: list, max_batch_size: int):
    """The answer at one state: (finished, admitted) as lists of ints, or the FAIL line for what is wrong with it."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return f"FAIL: return a pair of lists, (finished, admitted); at step {step} it returned {out!r}"
    try:
        finished, admitted = [int(r) for r in out[0]], [int(r) for r in out[1]]
    except (TypeError, ValueError):
        return f"FAIL: finished and admitted are lists of request ids (ints); at step {step} it returned {out!r}"
    left = dict(running)
    for name, ids in (("finished", finished), ("admitted", admitted)):
        twice = [r for r, c in Counter(ids).items() if c > 1]
        if twice:
            return f"FAIL: step {step}: duplicating a request: request {twice[0]} is {name} twice"
    stray = [r for r in finished if r not in left]
    if stray:
        return f"FAIL: step {step}: it finished request {stray[0]}, which is not running (running: {running})"
    early = [r for r in finished if left[r] > 0]
    if early:
        return (f"FAIL: step {step}: losing a request: request {early[0]} was finished with {left[early[0]]} token(s) "
                "still to generate; only a request with 0 tokens left is done")
    kept = [r for r, n in running if n == 0 and r not in finished]
    if kept:
        return (f"FAIL: step {step}: request {kept[0]} has generated its last token but was not finished: it would "
                "hold its slot (and its KV blocks) forever; a finished request leaves at once")
    again = [r for r in admitted if r in left]
    if again:
        return (f"FAIL: step {step}: duplicating a request: request {again[0]} is already running, yet it was "
                "admitted again (return only the newcomers)")
    unknown = [r for r in admitted if r not in waiting]
    if unknown:
        return f"FAIL: step {step}: request {unknown[0]} was admitted but is not in the waiting queue {waiting}"
    size = len(running) - len(finished) + len(admitted)
    if size > max_batch_size:
        return (f"FAIL: step {step}: exceeding max_batch_size: {size} requests would run with max_batch_size "
                f"{max_batch_size}; admit only while a slot is free")
    if admitted != waiting[: len(admitted)]:
        return (f"FAIL: step {step}: breaking FIFO: from the queue {waiting} (oldest first) it admitted {admitted}, "
                f"not the first {len(admitted)}; admit from the front, in arrival order (a set or a sort loses it)")
    return finished, admitted


def _name_short_admission(states: list, answers: list, short: list[int], max_batch_size: int) -> str:
    """Every answer was consistent, but some admitted fewer than the free slots allow: name the pattern if one
    explains every step (static batching, a refill a step late), else the first step that fell short."""
    static = all(adm == (waiting[:max_batch_size] if len(running) == len(fin) else [])
                 for (_, running, waiting, fin, _), (_, adm) in zip(states, answers))
    late = all(adm == waiting[: max(0, max_batch_size - len(running))]
               for (_, running, waiting, _, _), (_, adm) in zip(states, answers))
    step, running, waiting, fin, want = states[short[0]]
    adm = answers[short[0]][1]
    free = max_batch_size - (len(running) - len(fin))
    if static:
        return (f"FAIL: static batching: at step {step}, {free} slot(s) were free and {len(waiting)} request(s) "
                f"waiting, yet nothing was admitted because {len(running) - len(fin)} request(s) still ran; admit "
                "into every free slot, not only into an empty batch")
    if late:
        return (f"FAIL: refilling a step late: at step {step}, request(s) {fin} finished, leaving {free} slot(s) free, "
                f"but only {len(adm)} request(s) were admitted; count the free slots after the finished requests "
                "leave, so a freed slot is refilled in the same step")
    return (f"FAIL: step {step}: {free} slot(s) free and the queue {waiting}: it admitted {adm}, expected {want}; "
            "fill every free slot from the front of the queue")


def check_schedule_step(schedule_step: Callable) -> str:
    """Notebook 03: `schedule_step(running, waiting, max_batch_size)` is what the OnlineScheduler decides between two
    steps. `running` lists (request_id, tokens_left) in admission order, tokens_left being what the request has still
    to generate (0: the step just run produced its last token); `waiting` lists the ids of the requests that have
    arrived and not started, oldest first. It returns (finished, admitted): the running requests that leave now (no
    token left) and the waiting ones that join for the next step, from the front of the queue, while the batch has a
    free slot, a slot just freed by a finished request included. (The engine also stops at its token budget and when
    the KV pool is short: left out here.)

    The check replays a stream of requests (bursts that overfill the batch, a lull that lets it drain) at
    max_batch_size 4 and 2, calling the function at every step of a reference run, and names the mistake: static
    batching, a freed slot refilled a step late, a batch over max_batch_size, the queue out of order, a request
    lost or duplicated."""
    steps = 0
    try:
        for max_batch_size in SCHEDULE_MAX_BATCH_SIZES:
            states, answers = _schedule_states(max_batch_size), []
            for step, running, waiting, _, _ in states:
                try:
                    out = schedule_step(list(running), list(waiting), max_batch_size)
                except NotImplementedError:
                    raise
                except Exception as exc:
                    return (f"FAIL: at step {step} (running {running}, waiting {waiting}, max_batch_size "
                            f"{max_batch_size}) it raised {type(exc).__name__}: {exc}")
                answer = _judge_schedule_step(out, step, running, waiting, max_batch_size)
                if isinstance(answer, str):
                    return answer if "max_batch_size" in answer else answer + f" (max_batch_size {max_batch_size})"
                answers.append(answer)
            short = [i for i, (state, answer) in enumerate(zip(states, answers)) if answer[1] != state[4]]
            if short:
                return _name_short_admission(states, answers, short, max_batch_size) + (
                    f" (max_batch_size {max_batch_size})")
            steps += len(states)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your scheduling step"
    sizes = " and ".join(map(str, SCHEDULE_MAX_BATCH_SIZES))
    return (f"PASS: {len(_schedule_stream())} requests at max_batch_size {sizes} ({steps} steps): "
            "each finished request left at once, its slot refilled in the same step from the front of the queue, the "
            "batch never over its limit")
