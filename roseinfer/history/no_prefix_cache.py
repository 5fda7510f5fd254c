"""Before the prefix cache (retired by notebook 10): every prompt is computed from its first token.

Admission gives a request fresh blocks for its whole prompt and never looks
anything up, and no block is ever registered, so a request that starts like
an earlier one recomputes that shared beginning. It is the scheduler with
`enable_prefix_cache=False`, written out the way it was before the cache, so
the notebook can show the change as a diff.
"""

from __future__ import annotations

import dataclasses

from roseinfer.engine.block_manager import BlockManager, blocks_for
from roseinfer.engine.scheduler import OnlineScheduler, SchedulerLimits
from roseinfer.engine.sequence import RequestStatus, Sequence


class NoPrefixCacheScheduler(OnlineScheduler):
    variant = "no-prefix-cache"

    def __init__(self, block_manager: BlockManager, limits: SchedulerLimits, eos_token_ids: frozenset[int]) -> None:
        # update() registers full blocks only when the cache is on: off, nothing is ever found.
        super().__init__(block_manager, dataclasses.replace(limits, enable_prefix_cache=False), eos_token_ids)

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Give a waiting request its blocks; returns the tokens it computes now (0: not now)."""
        n = min(seq.num_tokens, budget)
        needed = blocks_for(n, self._blocks.block_size)
        if not self._blocks.can_allocate(needed):
            return 0
        seq.block_table = self._blocks.allocate(needed)
        seq.num_computed_tokens = 0
        seq.status = RequestStatus.RUNNING
        return n
