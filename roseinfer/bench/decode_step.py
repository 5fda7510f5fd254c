"""Time one real decode step (model, sampling, the host sync) at a given batch and context.

Used by notebook 09 (eager vs compiled on a CPU, eager vs CUDA graphs on a GPU)
and by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from roseinfer.engine.batch import BatchEntry
from roseinfer.engine.block_manager import blocks_for
from roseinfer.sampling import SamplingParams

GREEDY = SamplingParams(max_new_tokens=1)


@contextmanager
def decode_batch(engine, batch: int, context: int, seed: int = 0) -> Iterator[list[BatchEntry]]:
    """`batch` sequences with `context` tokens in the cache, and the decode step that extends them.

    Running the step again rewrites the same slot with the same values, so it can be timed over
    and over. The blocks are freed on exit.
    """
    blocks = engine.block_manager
    rng = random.Random(seed * 7919 + batch * 31 + context)
    vocab = engine.model_config.vocab_size
    tables = [blocks.allocate(blocks_for(context + 1, blocks.block_size)) for _ in range(batch)]
    try:
        for table in tables:  # fill the cache (untimed), one prompt at a time
            prompt = [rng.randrange(vocab) for _ in range(context)]
            engine.runner.execute(
                [BatchEntry(token_ids=prompt, start_pos=0, block_table=table, sample=False, params=GREEDY,
                            generator=None)]
            )
        yield [
            BatchEntry(token_ids=[rng.randrange(vocab)], start_pos=context, block_table=t, sample=True,
                       params=GREEDY, generator=None)
            for t in tables
        ]
    finally:
        for table in tables:
            blocks.free(table)


def step_times_ms(engine, step: list[BatchEntry], repeats: int, warm_up: int = 3) -> list[float]:
    """Wall time of `repeats` runs of the step, in ms (each ends in the sampled tokens' host sync)."""
    cuda = engine.device.type == "cuda"
    for _ in range(warm_up):
        engine.runner.execute(step)
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        engine.runner.execute(step)
        times.append((time.perf_counter() - start) * 1000)
    return times


def time_decode_step(engine, batch: int, context: int, repeats: int) -> float:
    """Median ms of one decode step at batch x context."""
    with decode_batch(engine, batch, context) as step:
        return statistics.median(step_times_ms(engine, step, repeats))
