"""Leave the cores' OpenMP workers to the one thread that runs the engine's steps.

torch runs its parallel CPU operators on OpenMP, and OpenMP (libgomp, the
runtime torch ships on Linux) keeps a separate pool of worker threads for
each thread that starts parallel work. Loading and warming an engine in the
main thread gives the main thread a pool; the manager's worker thread, which
runs every step, then gets a second one. With more pool threads than cores,
libgomp stops letting idle workers spin between parallel regions (its
"throttled" spin count): each of the ~300 operators of a decode step then
waits for its workers to wake up from sleep. On a 2-core CPU that made a gpt2
decode step at batch 16 about a fifth slower in the worker thread than the
same step in the main thread (`python benchmarks/benchmark_worker_thread.py`).

`release_openmp_workers()` frees the calling thread's pool with OpenMP 5's
`omp_pause_resource_all`; the next parallel operator that thread runs starts
a new pool. Managers call it from the thread that creates them, before their
worker starts, so that the worker's pool is the only one while they serve.
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger("roseinfer.engine")

OMP_PAUSE_HARD = 2  # omp_pause_resource_t: free the threads, not just park them


def _loaded_libgomp() -> str:
    """The libgomp torch runs on: the mapped copy's path (wheels may rename it), else its soname.

    A dlopen of a library already loaded returns that same library, pools and
    all; a fresh copy would have no pools, and pausing it would free nothing.
    """
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith("libgomp"):
                    return path
    except OSError:
        pass
    return "libgomp.so.1"


def release_openmp_workers() -> bool:
    """Free the calling thread's OpenMP worker pool; False where the runtime cannot (nothing changes)."""
    try:
        runtime = ctypes.CDLL(_loaded_libgomp())
        pause = runtime.omp_pause_resource_all
    except (OSError, AttributeError):  # no libgomp (macOS, another OpenMP), or one older than OpenMP 5
        return False
    pause.argtypes = [ctypes.c_int]
    pause.restype = ctypes.c_int
    released = pause(OMP_PAUSE_HARD) == 0  # nonzero inside a parallel region: nothing was freed
    if not released:
        logger.debug("omp_pause_resource_all refused; the calling thread keeps its OpenMP workers")
    return released
