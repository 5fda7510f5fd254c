"""Before the KV cache (retired by notebook 01): every step recomputes the whole sequence.

To produce token t+1 the model runs over all t tokens again, so a step costs
in proportion to the context, and a whole generation in proportion to its
square. It reuses the engine's model and runner: the K/V it writes go into
scratch blocks that are freed after every step, so nothing is remembered.
"""

from __future__ import annotations

from roseinfer.engine.block_manager import blocks_for
from roseinfer.engine.engine import InferenceEngine
from roseinfer.engine.runner import BatchEntry
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
            [token] = self.engine.runner.execute([BatchEntry(list(token_ids), 0, table, True, GREEDY, None)])
        finally:
            blocks.free(table)
        return token

    def generate(self, prompt_token_ids: list[int], max_new_tokens: int) -> list[int]:
        ids = list(prompt_token_ids)
        for _ in range(max_new_tokens):
            ids.append(self.next_token(ids))
        return ids[len(prompt_token_ids) :]
