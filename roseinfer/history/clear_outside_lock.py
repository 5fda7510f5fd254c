"""The wake-up event with its clear() outside the lock (a bug notebook 05 shows and the manager avoids).

The idle worker checks for work under the lock, releases it, and only then
clears the event. A request that arrives in between sets the event, and the
worker's clear() erases that set: it then waits although work is queued, until
some later request wakes it (or forever, if none comes).

`before_clear`, when given, runs in that window, so a notebook can put a
request exactly there and show the lost wake-up every time instead of once
in a million.
"""

from __future__ import annotations

from collections.abc import Callable

from roseinfer.server.manager import SchedulerManager


class ClearOutsideLockManager(SchedulerManager):
    variant = "clear-outside-lock"

    def __init__(self, *args, before_clear: Callable[[], None] | None = None, **kwargs) -> None:
        self.before_clear = before_clear
        super().__init__(*args, **kwargs)

    def _idle(self) -> None:
        with self._lock:
            if self._pending or self._aborts or self._stopping:
                return
        if self.before_clear is not None:
            self.before_clear()
        self._wakeup.clear()  # too late: a set() from the window above is lost
        self._wait_for_work()
        self.num_idle_wakeups += 1
