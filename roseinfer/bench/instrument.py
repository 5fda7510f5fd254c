"""Instrumentation the notebooks use to count what the code does (not to time it)."""

from __future__ import annotations

import threading


class CountingLock:
    """A drop-in for threading.Lock that counts acquisitions by one thread (e.g. the worker)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counted_thread: int | None = None
        self.count = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        acquired = self._lock.acquire(blocking, timeout)
        if acquired and threading.get_ident() == self.counted_thread:
            self.count += 1
        return acquired

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()


def count_worker_locks(manager) -> CountingLock:
    """Swap the manager's lock for a counting one that counts its worker thread's acquisitions."""
    lock = CountingLock()
    lock.counted_thread = manager._worker.ident
    manager._lock = lock
    return lock


class MethodTimer:
    """Wraps one method of one object and accumulates how long its calls take."""

    def __init__(self, obj, name: str) -> None:
        import time

        self.calls = 0
        self.seconds = 0.0
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        setattr(obj, name, timed)

    @property
    def mean_us(self) -> float:
        return self.seconds / self.calls * 1e6 if self.calls else float("nan")


def worker_cpu_seconds(manager) -> float:
    """CPU time the manager's worker thread has used so far (its own clock: not the process's other threads)."""
    import time

    return time.clock_gettime(time.pthread_getcpuclockid(manager._worker.ident))
