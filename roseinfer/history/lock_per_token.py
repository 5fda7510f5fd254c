"""Before batched worker lookups (retired by notebook 07): one lock per token.

After each step the worker takes the lock once for every request that got a
token or finished, to look up its stream, instead of once for the whole step.
With a batch of 64 that is 64 acquisitions a step, each one a chance for an
HTTP thread to hold the worker up.
"""

from __future__ import annotations

from roseinfer.server.manager import SchedulerManager, StepRecord


class LockPerTokenManager(SchedulerManager):
    variant = "lock-per-token"

    def _collect_step_records(self, step_tokens: dict[int, int], finished: list[int]) -> list[StepRecord]:
        done = set(finished)
        records = []
        for rid in step_tokens.keys() | done:
            with self._lock:
                stream = self._streams.pop(rid, None) if rid in done else self._streams.get(rid)
            if stream is not None:
                records.append(StepRecord(stream, step_tokens.get(rid), rid in done))
        return records
