"""Before continuous batching (retired by notebook 03): notebook 02's static batch as a scheduling policy.

`StaticBatchGenerator` (static_batching.py) is the same policy written as a loop of its own. Here it is the
`OnlineScheduler` with the two decisions continuous batching changed put back as they were, so notebook 03 can
serve both policies through one loop and show the change as a diff of the scheduler's methods:

- admission: waiting requests join only once the whole batch has drained, never into a slot freed mid-batch;
- finishing: a request that is done keeps its row (it recomputes its last position and the token is thrown
  away, as padding), and its blocks, until the batch's longest request is done.

Everything else (token budget, chunked prefill, preemption, block tables) is today's scheduler, and a request
gets the same greedy tokens as under it.
"""

from __future__ import annotations

from roseinfer.engine.batch import ScheduledBatch
from roseinfer.engine.scheduler import OnlineScheduler
from roseinfer.engine.sequence import Sequence


class StaticBatchScheduler(OnlineScheduler):
    variant = "static-batch"

    def _schedule_admissions(self, batch: ScheduledBatch, budget: int) -> None:
        if self._last_preempted or self._running:
            return  # a static batch takes newcomers only once its longest request is done
        admitted = 0
        while (
            self._waiting
            and budget > 0
            and len(self._running) < self.limits.max_batch_size
            and admitted < self.limits.max_prefills_per_step
        ):
            n = self._admit(self._waiting[0], budget)
            if n == 0:
                break
            seq = self._waiting.popleft()
            self._running.append(seq)
            self._add_to_batch(batch, seq, n)
            budget -= n
            admitted += 1

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        self._mark_finished(seq, reason, now)  # its row stays in the batch, computed and thrown away
        if all(s.is_finished for s in self._running):  # the longest is done: the whole batch leaves
            for s in self._running:
                self._release(s)
            self._running.clear()
