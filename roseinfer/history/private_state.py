"""Before the scheduler's public accessors (retired by notebook 06).

This manager reaches into the scheduler's private request table to read a
finished request's outcome, instead of calling `pop_response`. It behaves
the same today, and breaks silently the day the scheduler's internals change;
anything it mutates through those references corrupts the scheduler.
"""

from __future__ import annotations

from roseinfer.engine.sequence import RequestMetrics
from roseinfer.server.manager import SchedulerManager


class PrivateStateManager(SchedulerManager):
    variant = "private-state"

    def _pop_finished(self, request_id: int) -> tuple[str, RequestMetrics]:
        seq = self._scheduler._requests.pop(request_id)  # private state, no copy
        return seq.finish_reason, seq.metrics
