"""The scheduler manager as notebook 04 introduces it, before notebooks 05-07 refine it.

Today's SchedulerManager with their three changes taken back out: the idle worker polls every 5 ms (05 wakes
it with an event), finished requests are read from the scheduler's private table (06's accessors), and the
worker takes the lock once per token (07 takes it once per step). Everything else is today's code.
"""

from __future__ import annotations

from roseinfer.history.lock_per_token import LockPerTokenManager
from roseinfer.history.polling_worker import PollingWorkerManager
from roseinfer.history.private_state import PrivateStateManager


class FirstManager(PollingWorkerManager, PrivateStateManager, LockPerTokenManager):
    """SchedulerManager of notebook 04: no wake-up event (05), no accessors (06), a lock per token (07)."""

    variant = "first-manager"
