"""Earlier versions of roseinfer's components, kept runnable for the notebooks.

Each module is named for the notebook that retires it and holds a small
subclass or strategy that overrides only what that notebook's increment
changed; everything else is today's code. Before and after give the same
greedy tokens, and the notebooks assert it.

    notebook 03  static_batching   StaticBatchGenerator   static batches, padded to the longest
    notebook 04  no_manager        NoManager              one request at a time under a global lock
    notebook 05  polling_worker    PollingWorkerManager   idle worker polls every 5 ms
    notebook 06  private_state     PrivateStateManager    reads scheduler internals
    notebook 07  lock_per_token    LockPerTokenManager    one lock acquisition per token
    notebook 10  no_prefix_cache   NoPrefixCacheScheduler every prompt computed from its first token

`make_manager(name, engine, **options)` builds any manager variant by name;
the server (`--manager-variant`) and the benchmarks (`--variant`) use it.
"""

from __future__ import annotations

from typing import Any

from roseinfer.engine.engine import InferenceEngine
from roseinfer.history.lock_per_token import LockPerTokenManager
from roseinfer.history.no_manager import NoManager
from roseinfer.history.polling_worker import PollingWorkerManager
from roseinfer.history.private_state import PrivateStateManager
from roseinfer.server.manager import SchedulerManager, StreamingFrontend

MANAGER_VARIANTS: dict[str, type[StreamingFrontend]] = {
    "current": SchedulerManager,
    "no-manager": NoManager,
    "polling": PollingWorkerManager,
    "private-state": PrivateStateManager,
    "lock-per-token": LockPerTokenManager,
}


def make_manager(name: str, engine: InferenceEngine, **options: Any) -> StreamingFrontend:
    try:
        cls = MANAGER_VARIANTS[name]
    except KeyError:
        raise ValueError(
            f"unknown manager variant {name!r}; choose from {', '.join(MANAGER_VARIANTS)}"
        ) from None
    return cls(engine, **options)
