"""Before notebook 02: one request at a time, from its prefill to its last token, then the next.

`_run_one` is `StaticBatchGenerator._run_group` (static_batching.py) written for one request, so the diff of the
two is notebook 02's increment alone: every single entry, block table and output becomes a list of them.
"""

from __future__ import annotations

from roseinfer.engine.batch import BatchEntry
from roseinfer.engine.block_manager import blocks_for
from roseinfer.history.static_batching import StaticBatchGenerator, StaticBatchStats
from roseinfer.sampling import SamplingParams


class OneRequestGenerator(StaticBatchGenerator):
    """Before batching: each request alone, prefill to last token, then the next (one row in every step)."""

    def __init__(self, engine) -> None:
        super().__init__(engine, batch_size=1)

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> StaticBatchStats:
        stats = StaticBatchStats()
        for prompt, p in zip(prompts, params):
            stats.token_ids.append(self._run_one(prompt, p, stats))
        return stats

    def _run_one(self, prompt, params, stats: StaticBatchStats) -> list[int]:
        blocks = self.engine.block_manager
        steps = params.max_new_tokens
        table = blocks.allocate(blocks_for(len(prompt) + steps, blocks.block_size))
        generator = params.make_generator(self.engine.device)
        output: list[int] = []
        try:
            entry = BatchEntry(list(prompt), 0, table, True, params, generator)
            for _ in range(steps):
                [token] = self.engine.runner.execute([entry])
                stats.steps += 1
                output.append(token)
                if self._finished(output, params):
                    break
                entry = BatchEntry([token], entry.start_pos + len(entry.token_ids), table, True, params, generator)
        finally:
            blocks.free(table)
        return output
