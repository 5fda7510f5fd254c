"""Notebook 05's exercise: the idle worker sleeps on the wake-up event."""

from __future__ import annotations

from collections.abc import Callable

IDLE_WINDOW_S = 0.03  # how long an idle worker is watched for naps or spinning (a right answer is seen asleep at once)
IDLE_SETTLE_S = 0.2  # the most a right answer may take to get somewhere on a loaded machine; only odd answers wait it
IDLE_SPIN_LOOKS = 100  # looks for work within the window that mean it never sleeps (5 ms naps make about 6)
IDLE_MAX_POINTS = 64  # the moments between the worker's operations where a request is put, per kind of work
_IDLE_OPS = {"acquire": "taking of self._lock", "release": "release of self._lock", "pending": "look at self._pending",
             "aborts": "look at self._aborts", "stopping": "look at self._stopping", "clear": "clear()",
             "is_set": "is_set()", "wait": "wait()", "set": "set()"}
_IDLE_WORK = {"request": "a request (self._pending)", "abort": "an abort (self._aborts)",
              "close": "close() (self._stopping)"}


class _IdleAbandoned(BaseException):
    """Raised in the worker thread at its next operation once the check is done with it: no thread is left running.
    A BaseException, so that an `except Exception` in the answer does not swallow it."""


class _IdleLock:
    """The stand-in manager's self._lock: a threading.Lock whose every use by the worker is noted."""

    def __init__(self, run) -> None:
        self._run = run

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self._run.note("acquire")
        if not blocking:
            return self._run.raw_lock.acquire(False)
        while not self._run.raw_lock.acquire(timeout=0.01):  # a worker that deadlocks itself still ends
            self._run.check_abandoned()
        return True

    def release(self) -> None:
        self._run.raw_lock.release()
        self._run.note("release")

    def locked(self) -> bool:
        return self._run.raw_lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class _IdleEvent:
    """The stand-in manager's self._wakeup: a threading.Event whose every use by the worker is noted."""

    def __init__(self, run) -> None:
        import threading

        self._run, self.event = run, threading.Event()

    def set(self) -> None:
        self._run.note("set")
        self.event.set()

    def clear(self) -> None:
        self._run.note("clear")
        self.event.clear()

    def is_set(self) -> bool:
        self._run.note("is_set")
        return self.event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        self._run.note("wait", timeout)
        try:
            return self.event.wait(timeout)
        finally:
            self._run.left_wait()


class _IdleManager:
    """The `self` that check_worker_idle passes: the SchedulerManager fields the idle worker uses, every use noted."""

    before_clear = None  # ClearOutsideLockManager's hook (the tests pass that variant's _idle): none here

    def __init__(self, run) -> None:
        self._run, self._lock, self._wakeup = run, _IdleLock(run), _IdleEvent(run)
        self.num_idle_wakeups = 0

    @property
    def _pending(self) -> list:
        self._run.note("pending")
        return self._run.pending

    @property
    def _aborts(self) -> list:
        self._run.note("aborts")
        return self._run.aborts

    @property
    def _stopping(self) -> bool:
        self._run.note("stopping")
        return self._run.stopping

    def _wait_for_work(self) -> None:  # SchedulerManager's
        self._wakeup.wait()


class _IdleRun:
    """One worker thread running `idle` as SchedulerManager._worker_loop does (idle, take the work if any, idle
    again), with no work at first. With `put_at`, the check's hook puts one piece of work (`kind`) in, from the
    worker's own thread, right before the worker's operation number `put_at` (or the first one after it that does
    not run under the lock): the submitter's moment, held still, as notebook 05's hook holds it."""

    def __init__(self, idle: Callable, stale: bool = False, kind: str = "request", put_at: int | None = None) -> None:
        import threading
        import time

        self.cv, self.raw_lock = threading.Condition(), threading.Lock()
        self.pending: list = []
        self.aborts: list = []
        self.stopping = False
        self.manager = _IdleManager(self)
        if stale:  # a set() left by a request the worker took while it was busy
            self.manager._wakeup.event.set()
        self.kind, self.put_at, self.put_where = kind, put_at, None
        self.log: list[tuple[str, str]] = []  # (whose, what): "worker" or "put", in order
        self.ops = self.looks = self.laps = self.waits = 0
        self.in_wait, self.wait_timeout = False, None
        self.served = self.done = self.abandoned = False
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._work, args=(idle,), name="check_worker_idle", daemon=True)
        self.thread.start()

    def _work(self, idle: Callable) -> None:
        try:
            while True:
                with self.cv:
                    self.check_abandoned()
                    self.laps += 1
                    self.looks += 1
                idle(self.manager)
                if not self.raw_lock.acquire(timeout=IDLE_SETTLE_S):  # _take_new_work
                    raise RuntimeError("it returned with self._lock still held")
                try:
                    with self.cv:
                        self.check_abandoned()
                        if self.pending or self.aborts or self.stopping:
                            self.served = True
                            return
                finally:
                    self.raw_lock.release()
        except _IdleAbandoned:
            pass
        except BaseException as exc:
            self.error = exc
        finally:
            with self.cv:
                self.done = True
                self.cv.notify_all()

    def check_abandoned(self) -> None:
        if self.abandoned:
            raise _IdleAbandoned

    def note(self, what: str, timeout: float | None = None) -> None:
        """Called right before the worker's operation `what` takes effect (a release: right after), in its thread."""
        with self.cv:
            self.check_abandoned()
            index, self.ops = self.ops, self.ops + 1
            if what == "release":  # already done: a put at this moment comes after it
                self.log.append(("worker", what))
            put = (self.put_at is not None and self.put_where is None and index >= self.put_at
                   and not self.raw_lock.locked())  # a submitter cannot queue while the worker holds the lock
            if put:
                self.put_where = index
        if put:
            self.put("worker")
        with self.cv:  # after the put: the worker is not seen asleep before a put at this moment is in
            if what != "release":
                self.log.append(("worker", what))
            self.looks += what in ("pending", "is_set", "wait")
            if what == "wait":
                self.waits += 1
                self.in_wait, self.wait_timeout = True, timeout
            self.cv.notify_all()

    def left_wait(self) -> None:
        with self.cv:
            self.in_wait = False
            self.cv.notify_all()
            self.check_abandoned()

    def put(self, who: str) -> bool:
        """What the manager's callers do: queue the work under the lock, then set the event. False if the lock
        could not be had (the worker holds it while it sleeps)."""
        if not self.raw_lock.acquire(timeout=IDLE_SETTLE_S if who == "check" else -1):
            return False
        try:
            with self.cv:  # queued and set at once, as far as the watching thread can tell
                if self.kind == "request":
                    self.pending.append("request")
                elif self.kind == "abort":
                    self.aborts.append(7)
                else:
                    self.stopping = True
                self.manager._wakeup.event.set()
                self.log.append(("put", "set"))
                self.cv.notify_all()
        finally:
            self.raw_lock.release()
        return True

    def work(self) -> bool:
        return bool(self.pending or self.aborts or self.stopping)

    def asleep(self, timed: bool = False) -> bool:
        """In a wait that only a set() ends (a timed one too if `timed`), the event clear, no work queued."""
        return (self.in_wait and (timed or self.wait_timeout is None) and not self.manager._wakeup.event.is_set()
                and not self.work())

    def lost(self) -> bool:
        """Asleep on the event, the event clear, work queued: nothing will wake it (a timed wait: not before its nap)."""
        return self.in_wait and not self.manager._wakeup.event.is_set() and self.work()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        with self.cv:
            self.cv.wait_for(predicate, timeout)

    def finish(self) -> None:
        with self.cv:
            self.abandoned = True
            self.cv.notify_all()
        self.manager._wakeup.event.set()  # a sleeping worker wakes, and ends at its next operation
        self.thread.join(IDLE_SETTLE_S)


def _idle_error(run: _IdleRun) -> str:
    if isinstance(run.error, NotImplementedError):
        return "not written yet: replace the `raise NotImplementedError` with your idle wait"
    return f"FAIL: it raised {type(run.error).__name__}: {run.error}"


def _judge_idle(run: _IdleRun, stale: bool) -> str | None:
    """Nothing to do: the worker must be asleep on the event after one look. Else name what it does instead."""
    import time

    ms = (time.perf_counter() - run.started) * 1000
    with run.cv:
        if run.error is not None:
            return _idle_error(run)
        if run.in_wait and run.raw_lock.locked():
            return ("FAIL: it waits while holding self._lock: no request can be queued to wake it (add_request "
                    "queues under that lock); release the lock, then wait")
        if run.in_wait and run.waits == 1 and run.laps == 1 and not run.manager._wakeup.event.is_set():
            return None
        log = [what for whose, what in run.log if whose == "worker"]
        first_wait = log.index("wait") if "wait" in log else len(log)
        if stale and "clear" not in log and run.waits >= 2:
            return (f"FAIL: never clearing: the event stays set from a request the worker already took, so every "
                    f"wait returns at once and the idle worker spins ({run.looks} looks for work in {ms:.0f} ms, "
                    "none there); clear it when you find no work")
        if stale and run.in_wait and run.waits == 2 and "clear" in log and log.index("clear") > first_wait:
            return ("FAIL: clearing after the wait: a set() left by a request the worker already took woke the idle "
                    "worker once for nothing (its first wait returned at once); clear when you find no work, in the "
                    "same critical section as that check, then wait")
        if run.looks >= IDLE_SPIN_LOOKS:
            return (f"FAIL: busy-spinning: with nothing to do it looked for work {run.looks} times in {ms:.0f} ms and "
                    "never slept (returning at once is a spin too: the worker loop calls it again); wait on "
                    "self._wakeup")
        if run.waits >= 2:
            return (f"FAIL: polling: with nothing to do it woke {run.waits} times in {ms:.0f} ms, every wait "
                    f"ending at its timeout ({run.wait_timeout} s): a nap by another name; wait() with no timeout, "
                    "until a request sets the event")
        if run.laps >= 2 or run.looks >= 2:
            return (f"FAIL: polling: with nothing to do it looked for work {run.looks} times in {ms:.0f} ms, "
                    "sleeping a fixed nap in between: a request waits for the rest of the nap, and an idle server "
                    "keeps waking up; wait on self._wakeup, which a request sets")
        return (f"FAIL: after {ms:.0f} ms with nothing to do it is neither asleep on self._wakeup nor looking for "
                "work: sleeping a fixed nap? Wait on the event, which a request sets")


def _idle_watch(idle: Callable, stale: bool) -> str | None:
    """No work, the event clear (or `stale`: set by a request already taken): asleep at once? Then a request."""
    run = _IdleRun(idle, stale=stale)
    try:
        run.wait_for(lambda: run.done or run.asleep(), IDLE_WINDOW_S)
        with run.cv:  # neither asleep nor round twice yet: a loaded machine, or a long nap
            slow = not (run.done or run.in_wait) and run.looks < 3 and run.laps < 2
        if slow:
            run.wait_for(lambda: run.done or run.in_wait or run.looks >= 3 or run.laps >= 2, IDLE_SETTLE_S)
        verdict = _judge_idle(run, stale)
        if verdict:
            return verdict
        if not run.put("check"):
            return "FAIL: it waits while holding self._lock: no request can be queued to wake it"
        run.wait_for(lambda: run.done or run.lost(), IDLE_SETTLE_S)
        if run.error is not None:
            return _idle_error(run)
        if not run.served:
            return ("FAIL: a request submitted while the worker slept (queued, then self._wakeup.set()) did not wake "
                    "it: wait on self._wakeup")
        return None
    finally:
        run.finish()


def _judge_idle_point(run: _IdleRun, where: str) -> str:
    """The work was queued and the event set, yet the worker sleeps: name why."""
    log = [what for whose, what in run.log if whose == "worker"]
    field = {"abort": "aborts", "close": "stopping"}.get(run.kind)
    work = _IDLE_WORK[run.kind]
    if field and field not in log:
        return (f"FAIL: it looks only at self._pending: {work} queued {where} set the event, yet the worker "
                f"cleared it and sleeps, the work unseen; there is work when self._pending or self._aborts or "
                "self._stopping")
    put = run.log.index(("put", "set"))
    if "clear" in [what for whose, what in run.log[put:] if whose == "worker"]:
        return (f"FAIL: lost wake-up: {work} queued {where} set the event, and the worker's clear() after it "
                "erased that set(): the worker sleeps with the work queued until something else wakes it. Clear in "
                "the same critical section as the check for work, under self._lock (or before the check)")
    return (f"FAIL: lost wake-up: {work} queued {where} set the event, yet the worker sleeps with it queued: after "
            "the check finds no work, only the event may decide whether to sleep")


def _idle_point(idle: Callable, kind: str, point: int) -> tuple[str | None, bool]:
    """Put `kind` of work in right before the worker's operation number `point`: is it taken? (verdict, whether the
    put came before the worker fell asleep)."""
    run = _IdleRun(idle, kind=kind, put_at=point)
    try:
        run.wait_for(lambda: run.done or run.asleep(timed=True) or run.lost(), IDLE_SETTLE_S)
        with run.cv:
            if run.error is not None:
                return _idle_error(run), True
            if run.served:
                return None, True
            inline = run.put_where is not None
            if inline:  # the worker's operations on either side of the put, as they took effect
                put = run.log.index(("put", "set"))
                before = [_IDLE_OPS[what] for whose, what in run.log[:put] if whose == "worker"][-1:]
                after = [_IDLE_OPS[what] for whose, what in run.log[put:] if whose == "worker"][:1]
                where = " and ".join(f"{side} its {op[0]}" for side, op in (("after", before), ("before", after))
                                     if op)
        if not inline:  # asleep before `point` operations: put it in now, from this thread
            if not run.put("check"):
                return "FAIL: it waits while holding self._lock: no request can be queued to wake it", False
            run.wait_for(lambda: run.done or run.lost(), IDLE_SETTLE_S)
            where = "while the worker slept"
        with run.cv:
            if run.error is not None:
                return _idle_error(run), inline
            if run.served:
                return None, inline
            if run.lost():
                return _judge_idle_point(run, where), inline
        return (f"FAIL: {_IDLE_WORK[kind]} queued {where}: after {IDLE_SETTLE_S * 1000:.0f} ms the worker had neither "
                "returned to take it nor gone to sleep"), inline
    finally:
        run.finish()


def check_worker_idle(idle: Callable) -> str:
    """Notebook 05: `idle(self)` is SchedulerManager._idle, what the worker does when it has nothing to step. `self`
    has the manager's `_lock`, `_pending` (queued requests), `_aborts`, `_stopping` (close() was called) and `_wakeup`
    (a threading.Event). Callers queue work under `_lock`, then call `_wakeup.set()`. It must return at once if
    there is work, else sleep on `_wakeup` until a set() (no timeout, no nap), clearing the event at the point where
    no set() can be lost, and return when woken; the worker loop then takes the work and calls it again if none.

    The check watches it idle (the event clear, then set by a request already taken) and puts work in right before
    each of its operations in turn, from the worker's own thread, so that every interleaving with a submitter is
    tried exactly, not by luck. It names the mistake: a lost wake-up, polling with a nap, busy-spinning, never
    clearing the event."""
    for stale in (False, True):
        verdict = _idle_watch(idle, stale)
        if verdict:
            return verdict
    points = 0
    for kind in _IDLE_WORK:
        for point in range(IDLE_MAX_POINTS):
            verdict, inline = _idle_point(idle, kind, point)
            if verdict:
                return verdict
            points += 1
            if not inline:  # the worker was asleep before this operation: later points are the same
                break
    return (f"PASS: asleep on the event at once when idle, even with a stale set(); woken by a request, an abort and "
            f"close() put in at each of {points} moments around its check, clear and wait: no wake-up lost")
