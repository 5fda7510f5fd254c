"""Before continuous batching (retired by notebook 03): static batches.

Requests are cut into fixed groups. A group is prefilled together and then
decoded together until its *longest* request is done: a request that finished
early keeps its row in the batch (computed and thrown away, as padding in
`model.generate`), and no new request may start until the whole group ends.
`OnlineScheduler` removes both wastes; this class measures them.

It drives the same ModelRunner and KV pool, so a request gets the same greedy
tokens here as under the OnlineScheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from roseinfer.engine.batch import BatchEntry
from roseinfer.engine.block_manager import blocks_for
from roseinfer.engine.engine import InferenceEngine
from roseinfer.sampling import SamplingParams


@dataclass
class StaticBatchStats:
    steps: int = 0
    computed_rows: int = 0  # request-rows computed in decode steps
    wasted_rows: int = 0  # of which belonged to requests already finished
    token_ids: list[list[int]] = field(default_factory=list)

    @property
    def wasted_fraction(self) -> float:
        return self.wasted_rows / self.computed_rows if self.computed_rows else 0.0


class StaticBatchGenerator:
    def __init__(self, engine: InferenceEngine, batch_size: int) -> None:
        self.engine = engine
        self.batch_size = batch_size

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> StaticBatchStats:
        stats = StaticBatchStats()
        for start in range(0, len(prompts), self.batch_size):
            group = range(start, min(start + self.batch_size, len(prompts)))
            stats.token_ids += self._run_group([prompts[i] for i in group], [params[i] for i in group], stats)
        return stats

    def _run_group(self, prompts, params, stats: StaticBatchStats) -> list[list[int]]:
        blocks = self.engine.block_manager
        steps = max(p.max_new_tokens for p in params)
        tables = [blocks.allocate(blocks_for(len(p) + steps, blocks.block_size)) for p in prompts]
        generators = [p.make_generator(self.engine.device) for p in params]
        outputs: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        try:
            entries = [
                BatchEntry(list(p), 0, t, True, sp, g)
                for p, t, sp, g in zip(prompts, tables, params, generators)
            ]
            for step in range(steps):
                tokens = self.engine.runner.execute(entries)
                stats.steps += 1
                if step > 0:
                    stats.computed_rows += len(entries)
                    stats.wasted_rows += sum(done)
                for i, token in enumerate(tokens):
                    if not done[i]:
                        outputs[i].append(token)
                        done[i] = self._finished(outputs[i], params[i])
                # Every row, finished or not, feeds its last token back: the batch shape is static.
                entries = [
                    BatchEntry(
                        [tok], e.start_pos + len(e.token_ids), e.block_table, True, e.params, e.generator
                    )
                    for e, tok in zip(entries, tokens)
                ]
                if all(done):
                    break
        finally:
            for table in tables:
                blocks.free(table)
        return outputs

    def _finished(self, output: list[int], params: SamplingParams) -> bool:
        if params.is_eos_stop(output[-1], self.engine.eos_token_ids):
            return True
        return len(output) >= params.max_new_tokens
