"""Before the KV cache (retired by notebook 01): every step recomputes the whole sequence.

To produce token t+1 the model runs over all t tokens again, so a step costs
in proportion to the context, and a whole generation in proportion to its
square. It reuses the engine's model and runner: the K/V it writes go into
scratch blocks that are freed after every step, so nothing is remembered.

`KVCacheGenerator` is the same one-request loop with the increment, written
so that its diff against `RecomputeGenerator` is the increment and nothing
else. The engine does the same in `InferenceEngine.step` for many requests:
each step feeds `seq.tokens(start, end)` from `start = seq.num_computed_tokens`.
"""

from __future__ import annotations

from roseinfer.engine.batch import BatchEntry
from roseinfer.engine.block_manager import blocks_for
from roseinfer.engine.engine import InferenceEngine
from roseinfer.sampling import SamplingParams

GREEDY = SamplingParams(max_new_tokens=1)


class RecomputeGenerator:
    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine

    def next_token(self, token_ids: list[int]) -> int:
        """One greedy step: a full forward pass over every token so far."""
        blocks = self.engine.block_manager
        table = blocks.allocate(blocks_for(len(token_ids), blocks.block_size))
        try:
            entry = BatchEntry(
                token_ids=list(token_ids),
                start_pos=0,
                block_table=table,
                sample=True,
                params=GREEDY,
                generator=None,
            )
            [token] = self.engine.runner.execute([entry])
        finally:
            blocks.free(table)
        return token

    def generate(self, prompt_token_ids: list[int], max_new_tokens: int) -> list[int]:
        ids = list(prompt_token_ids)
        for _ in range(max_new_tokens):
            ids.append(self.next_token(ids))
        return ids[len(prompt_token_ids) :]


class KVCacheGenerator(RecomputeGenerator):
    """After (notebook 01): the K/V of every token computed so far stay in this sequence's blocks."""

    def __init__(self, engine: InferenceEngine) -> None:
        super().__init__(engine)
        self.table: list[int] = []
        self.num_cached = 0  # tokens whose K/V are already in self.table

    def next_token(self, token_ids: list[int]) -> int:
        """One greedy step: a forward pass over the tokens not cached yet (the prompt, then one a step)."""
        blocks = self.engine.block_manager
        self.table += blocks.allocate(blocks_for(len(token_ids), blocks.block_size) - len(self.table))
        entry = BatchEntry(
            token_ids=list(token_ids[self.num_cached :]),
            start_pos=self.num_cached,
            block_table=self.table,
            sample=True,
            params=GREEDY,
            generator=None,
        )
        [token] = self.engine.runner.execute([entry])
        self.num_cached = len(token_ids)
        return token

    def generate(self, prompt_token_ids: list[int], max_new_tokens: int) -> list[int]:
        try:
            return super().generate(prompt_token_ids, max_new_tokens)
        finally:  # the cache lives as long as the request
            self.engine.block_manager.free(self.table)
            self.table, self.num_cached = [], 0
