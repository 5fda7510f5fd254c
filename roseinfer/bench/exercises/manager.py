"""Notebook 04's exercise: one pass of the scheduler manager's worker."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

# Requests submitted before each pass of check_worker_pass: (request id, its tokens, the steps its prompt takes).
# Request 12's prompt takes two steps (a chunked prefill), so it gets no token in its first step, between 7 and 3.
WORKER_SCRIPT: tuple[tuple[tuple[int, tuple[int, ...], int], ...], ...] = (
    (),  # idle: nothing submitted, nothing in flight
    ((7, (700, 701, 702), 1), (12, (1200, 1201), 2), (3, (300,), 1)),  # a burst; 3 ends in its first step
    (),
    ((5, (500, 501), 1), (9, (900,), 2)),  # joins requests in flight
    (),
    (),  # idle again: every request has ended
    ((1, (100, 101), 1),),
    ((2, (200,), 1),),  # 2 and 1 end in the same step
    (),  # idle
)
SCHEDULER_OWN_IDS = 1000  # the stand-in scheduler numbers a request from here when add_request gets no request_id


class _WaitedOnInbox(Exception):
    """Raised by check_worker_pass's inbox when the pass waits on it while it is empty."""


class _Inbox:
    """check_worker_pass's inbox, with queue.SimpleQueue's methods. A wait on it while it is empty raises (a real
    queue would hang the pass) rather than block."""

    def __init__(self) -> None:
        from collections import deque

        self._items: deque = deque()

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        self._items.append(item)

    def put_nowait(self, item) -> None:
        self._items.append(item)

    def get(self, block: bool = True, timeout: float | None = None):
        import queue

        if self._items:
            return self._items.popleft()
        if block:
            raise _WaitedOnInbox
        raise queue.Empty

    def get_nowait(self):
        return self.get(False)

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


class _ScriptedRequest:
    """A validated request, as the stand-in scheduler sees it: its tokens are scripted, not sampled."""

    def __init__(self, request_id: int, tokens: tuple[int, ...], prefill_steps: int) -> None:
        self.request_id, self.tokens, self.prefill_steps = request_id, tokens, prefill_steps

    def __repr__(self) -> str:
        return f"<request {self.request_id}>"


class _ScriptedScheduler:
    """check_worker_pass's stand-in for the manager's OnlineScheduler, with its method names; `step()` is
    `engine.step(scheduler)`. Every request in flight is in every step; a request's prompt takes `prefill_steps`
    steps, the last of them giving its first token; it ends in the step that gives its last token."""

    def __init__(self) -> None:
        import itertools

        self._own_ids = itertools.count(SCHEDULER_OWN_IDS)
        self._running: dict[int, list] = {}  # scheduler id -> [request, steps taken]
        self._finished: list[int] = []  # ended, not yet popped
        self.pass_index = 0
        self.added = 0
        self.steps = 0  # in this pass
        self.passes_stepped = 0
        self.idle_steps = 0  # in this pass, with nothing in flight
        self.produced_at: dict[int, int] = {}  # token -> the pass whose step gave it
        self.finished_at: dict[int, int] = {}  # handler's request id -> the pass whose step ended it

    def add_request(self, request, request_id: int | None = None) -> int:
        rid = next(self._own_ids) if request_id is None else request_id
        if rid in self._running:
            raise ValueError(f"request {rid} is already in the scheduler")
        self._running[rid] = [request, 0]
        self.added += 1
        return rid

    def has_unfinished(self) -> bool:
        return bool(self._running)

    def step(self) -> dict[int, int]:
        self.steps += 1
        self.passes_stepped += self.steps == 1
        if not self._running:
            self.idle_steps += 1
            return {}
        tokens = {}
        for rid, entry in list(self._running.items()):
            request, taken = entry[0], entry[1] + 1
            entry[1] = taken
            made = taken - request.prefill_steps + 1  # tokens given so far, this step's included
            if made >= 1:
                tokens[rid] = request.tokens[made - 1]
                self.produced_at[tokens[rid]] = self.pass_index
            if made == len(request.tokens):
                del self._running[rid]
                self._finished.append(rid)
                self.finished_at[request.request_id] = self.pass_index
        return tokens

    def pop_finished_ids(self) -> list[int]:
        ids, self._finished = self._finished, []
        return ids


def _worker_requests() -> dict[int, tuple[int, ...]]:
    return {rid: tokens for arrivals in WORKER_SCRIPT for rid, tokens, _ in arrivals}


def _run_worker_script(worker_pass: Callable):
    """Calls `worker_pass(inbox, scheduler, outputs)` once a pass of WORKER_SCRIPT, the script's requests submitted
    to the inbox before their pass, as a handler would: (request id, request, its own queue). Returns the FAIL line
    of a pass gone wrong, or (got, scheduler, outputs): got maps each request id to what its queue received, as
    (pass, item) pairs, item a token or None (its end)."""
    import queue

    inbox, scheduler, outputs = _Inbox(), _ScriptedScheduler(), {}
    queues: dict[int, queue.SimpleQueue] = {}
    got: dict[int, list[tuple[int, int | None]]] = {}
    submitted = 0
    for index, arrivals in enumerate(WORKER_SCRIPT):
        for rid, tokens, prefill_steps in arrivals:
            queues[rid] = queue.SimpleQueue()
            got[rid] = []
            inbox.put((rid, _ScriptedRequest(rid, tokens, prefill_steps), queues[rid]))
        submitted += len(arrivals)
        in_flight = len(scheduler._running)
        scheduler.pass_index, scheduler.steps, scheduler.idle_steps = index, 0, 0
        failed = _call_worker_pass(worker_pass, inbox, scheduler, outputs, index, in_flight)
        for rid, q in queues.items():  # what each handler reads, after the pass
            while True:
                try:
                    got[rid].append((index, q.get_nowait()))
                except queue.Empty:
                    break
        failed = _wrong_request(got) or failed  # tokens misrouted before an error are the first mistake
        if failed:
            return failed
        if scheduler.idle_steps:
            return (f"FAIL: stepping with nothing to do: at pass {index} the inbox was empty and no request was in "
                    "flight, yet it called step(); check has_unfinished() first (an idle worker would spin, stepping "
                    "empty batches)")
        if not inbox.empty():
            return (f"FAIL: submissions pile up: at pass {index}, {inbox.qsize()} of {len(arrivals)} requests "
                    "submitted since the last pass were left in the inbox; take every one each pass (one a pass "
                    "makes a burst of n wait up to n passes)")
        if scheduler.added != submitted:
            return (f"FAIL: at pass {index}, {submitted} requests had been taken off the inbox but "
                    f"{scheduler.added} added to the scheduler: add each one, "
                    "scheduler.add_request(request, request_id=request_id)")
        if scheduler.steps == 0 and scheduler._running:
            return (f"FAIL: at pass {index} requests were in flight but it did not step: take the inbox first, then "
                    "step if has_unfinished(), so that a new request is in this pass's step")
        if scheduler.steps > 1:
            return (f"FAIL: at pass {index} it stepped {scheduler.steps} times: one step a pass, so that what "
                    "handlers submit meanwhile joins the next step")
    return got, scheduler, outputs


def _call_worker_pass(worker_pass: Callable, inbox, scheduler, outputs, index: int, in_flight: int) -> str | None:
    """One pass of the reader's function: None, or the FAIL line for what it raised."""
    import queue

    try:
        worker_pass(inbox, scheduler, outputs)
    except NotImplementedError:
        raise
    except _WaitedOnInbox:
        return (f"FAIL: at pass {index} it waited on an empty inbox ({in_flight} request(s) in flight): a pass never "
                "waits (with requests in flight, a wait stalls their steps); take what is there, inbox.get_nowait() "
                "until queue.Empty, and return if there is nothing to step: the loop around waits for work")
    except queue.Empty:
        return (f"FAIL: at pass {index} queue.Empty escaped the pass: it means the inbox is drained; catch it and go "
                "on to the step")
    except KeyError as exc:
        rid = exc.args[0] if exc.args else "?"
        if isinstance(rid, int) and rid >= SCHEDULER_OWN_IDS:
            return (f"FAIL: KeyError {rid} at pass {index}: the scheduler numbered the request itself (add_request "
                    "without request_id) and step() gives its tokens under that number; pass request_id=the "
                    "handler's id, so the ids step() gives are the ones in outputs")
        return (f"FAIL: KeyError {rid!r} at pass {index}: no queue for that request; put each request's queue in "
                "outputs[request_id] when you take it off the inbox")
    except Exception as exc:
        return f"FAIL: at pass {index} it raised {type(exc).__name__}: {exc}"
    return None


def _wrong_request(got) -> str | None:
    """The FAIL line for a token in another request's queue, None if every token is in its own."""
    owner = {token: rid for rid, tokens in _worker_requests().items() for token in tokens}
    for rid, items in got.items():
        for index, item in items:
            if item is not None and owner.get(item) != rid:
                whose = f"request {owner[item]}'s" if item in owner else "no request's"
                return (f"FAIL: tokens routed to the wrong request: at pass {index}, request {rid}'s queue got token "
                        f"{item}, {whose}; route by the id step() gives, outputs[rid], not by position (a request "
                        "mid-prefill gets no token in a step) nor to the last queue taken")
    return None


def _judge_worker_run(got, scheduler, outputs) -> str:
    requests = _worker_requests()
    ends = {rid: [index for index, item in items if item is None] for rid, items in got.items()}
    for rid, passes in ends.items():
        if passes and passes[0] < scheduler.finished_at.get(rid, len(WORKER_SCRIPT)):
            return (f"FAIL: request {rid} was ended at pass {passes[0]} but had not finished: end a request only when "
                    "pop_finished_ids() reports it (one mid-prefill gets no token in a step, and is not finished)")
    for rid, passes in ends.items():
        if len(passes) > 1:
            return (f"FAIL: an end signalled {len(passes)} times: request {rid}'s queue got None at passes {passes}; "
                    "its handler stops at the first, the rest land in a stream that is over; end a request once, when "
                    "pop_finished_ids() reports it")
    for rid, items in got.items():
        values = [item for _, item in items]
        if None in values[:-1]:
            return (f"FAIL: request {rid} got token(s) {values[values.index(None) + 1:]} after its end: its handler "
                    "has stopped reading, so they are lost; put a request's last token first, then its end")
    tokens = {rid: [item for _, item in items if item is not None] for rid, items in got.items()}
    for rid, mine in tokens.items():
        twice = [t for t, c in Counter(mine).items() if c > 1]
        if twice:
            return f"FAIL: request {rid} got token {twice[0]} twice: hand each token over once"
    missing = {rid: [t for t in requests[rid] if t not in mine] for rid, mine in tokens.items()}
    missing = {rid: lost for rid, lost in missing.items() if lost}
    if missing:
        rid, lost = next(iter(missing.items()))
        if all(lost == [requests[r][-1]] and scheduler.produced_at.get(lost[0]) == scheduler.finished_at.get(r)
               for r, lost in missing.items()):  # only last tokens, each given by the step that ended its request
            return (f"FAIL: dropping a token: request {rid}'s last token, {lost[0]}, was lost ({len(missing)} "
                    "request(s) lost theirs); it came in the step that finished the request: put the token, then "
                    "the end")
        return (f"FAIL: dropping a token: request {rid} never got token(s) {lost}; every token step() gives goes to "
                "its request's queue, in the pass that gave it")
    for rid, mine in tokens.items():
        if mine != list(requests[rid]):
            return f"FAIL: request {rid}'s tokens came out of order: {mine}, expected {list(requests[rid])}"
    for rid, items in got.items():
        late = [(index, item) for index, item in items if item is not None and index != scheduler.produced_at[item]]
        if late:
            index, token = late[0]
            return (f"FAIL: request {rid}'s token {token}, given by the step of pass {scheduler.produced_at[token]}, "
                    f"reached its queue at pass {index}: hand each token over in the pass whose step gave it")
    for rid, passes in ends.items():  # late before never: ends read a pass late are lost when the next is idle
        if passes and passes[0] != scheduler.finished_at[rid]:
            return (f"FAIL: request {rid} finished in the step of pass {scheduler.finished_at[rid]} but its end came "
                    f"at pass {passes[0]}: call pop_finished_ids() after step(), in the same pass, or its handler "
                    "waits on")
    for rid, passes in ends.items():
        if rid in scheduler.finished_at and not passes:
            return (f"FAIL: a finished request never signalled: request {rid} finished at pass "
                    f"{scheduler.finished_at[rid]} but its queue never got its end (None): its handler would wait "
                    "forever; put None in the queue of every id pop_finished_ids() gives")
    if outputs:
        return (f"FAIL: request(s) {sorted(outputs)} ended but their queues are still in outputs: it would grow by one "
                "entry a request, forever; pop a request's queue when you end it")
    idle = len(WORKER_SCRIPT) - scheduler.passes_stepped
    return (f"PASS: {len(requests)} requests over {len(WORKER_SCRIPT)} passes ({idle} with nothing to do, not "
            "stepped): every submission taken in its pass, one step a pass with work, each token in its own request's "
            "queue in the pass that made it, each end once, after the last token")


def check_worker_pass(worker_pass: Callable) -> str:
    """Notebook 04: `worker_pass(inbox, scheduler, outputs)` is one pass of SchedulerManager's worker loop (its
    `_take_new_work`, then `engine.step`, `pop_finished_ids` and the delivery to the streams), which the loop around
    it repeats. `inbox` is a queue (queue.SimpleQueue's methods) of what handlers submitted since the last pass:
    (request_id, request, out), `out` that request's own queue.SimpleQueue, which its handler reads. `scheduler` has
    the OnlineScheduler's add_request(request, request_id=None), has_unfinished() and pop_finished_ids(), and step(),
    which stands for engine.step(scheduler): one batch for every request in flight, {request_id: new token}.
    `outputs` is the pass's own dict, request_id -> out, kept from one pass to the next (it starts empty).

    One pass: take every request off the inbox into the scheduler (its queue into outputs); if nothing is in flight,
    return (the loop waits for work); else step once, put each new token in its request's queue, and put None (the
    end) in the queue of each request that finished, after its last token, and drop that queue from outputs.

    The check runs a script of 9 passes with a stand-in scheduler (bursts, a request joining mid-flight, a chunked
    prefill that gets no token in a step, idle passes) and names the mistake: tokens routed to the wrong request, a
    finished request never signalled, an end signalled twice, requests taken one a pass, stepping with nothing to
    do, a token dropped. No thread is started: the loop and the handlers are the check's."""
    try:
        run = _run_worker_script(worker_pass)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your pass"
    if isinstance(run, str):
        return run
    return _judge_worker_run(*run)
