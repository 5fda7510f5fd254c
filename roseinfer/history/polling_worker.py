"""Before the wake-up event (retired by notebook 05): an idle worker that polls.

With nothing to do, the worker sleeps 5 ms and looks again. A request that
arrives during the nap waits for the rest of it (up to 5 ms of extra TTFT),
and an idle server still wakes up 200 times a second.
"""

from __future__ import annotations

import time

from roseinfer.server.manager import SchedulerManager

POLL_INTERVAL_S = 0.005


class PollingWorkerManager(SchedulerManager):
    variant = "polling"

    def _idle(self) -> None:
        time.sleep(POLL_INTERVAL_S)
        self.num_idle_wakeups += 1
