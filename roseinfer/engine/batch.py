"""What the scheduler hands the runner for one step, and what comes back.

`BatchEntry` is the runner's whole view of a request: which tokens to compute,
where their K/V go, whether to sample after them. `ScheduledBatch` keeps the
scheduler's side of the same step (which sequence, how many tokens), so that
`OnlineScheduler.update` can apply the sampled tokens to the right requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from roseinfer.sampling import SamplingParams

if TYPE_CHECKING:
    from roseinfer.engine.sequence import Sequence


@dataclass
class BatchEntry:
    token_ids: list[int]  # the new tokens to compute this step
    start_pos: int  # position of the first of them (= tokens already in the cache)
    block_table: list[int]
    sample: bool  # sample the next token after the last one (False mid-way through a prompt)
    params: SamplingParams
    generator: torch.Generator | None


@dataclass
class ScheduledBatch:
    """One step's work: (sequence, tokens it computes) pairs and their runner entries, in order."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    entries: list[BatchEntry] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.scheduled)

    def __len__(self) -> int:
        return len(self.scheduled)

    def produced(self, sampled: list[int | None]) -> dict[int, int]:
        """{request_id: token} for every entry that sampled a token."""
        return {seq.request_id: t for (seq, _), t in zip(self.scheduled, sampled) if t is not None}
