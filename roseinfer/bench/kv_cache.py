"""Notebook 01's measurement: one step without and with the KV cache, at several context lengths.

Recompute: `RecomputeGenerator.next_token`, a forward pass over all L tokens. KV cache: the production path,
one `engine.step` for a request whose L-token prompt was prefilled beforehand (outside the timing), so the
step computes one token against L cached ones; it also pays the scheduler's bookkeeping, so if anything the
cache's advantage is understated. Every repeat goes round all the contexts and both arms, so a drift of the
machine's speed hits every point alike; each repeat adds one token of context to both.
"""

from __future__ import annotations

import time

import torch

from roseinfer.history.no_kv_cache import RecomputeGenerator
from roseinfer.sampling import SamplingParams


def _timed_ms(cuda: bool, fn, *args) -> float:
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def time_steps(engine, contexts: list[int], repeats: int) -> dict[str, dict[int, list[float]]]:
    """{"recompute": {L: [ms, ...]}, "kv_cache": {L: [ms, ...]}}: `repeats` interleaved timings of each."""
    cuda = engine.device.type == "cuda"
    ids = {L: [(7 * i) % 50000 for i in range(L + repeats + 2)] for L in contexts}
    schedulers = {}
    for L in contexts:  # one scheduler a context, its L-token prompt prefilled now (not timed)
        scheduler = engine.new_scheduler(enable_prefix_cache=False)
        rid = engine.add_request(scheduler, prompt_token_ids=ids[L][:L],
                                 params=SamplingParams(max_new_tokens=repeats + 2, stop_on_eos=False))
        engine.step(scheduler)  # the prefill
        engine.step(scheduler)  # warm-up, as is the first recompute below
        RecomputeGenerator(engine).next_token(ids[L][:L])
        schedulers[L] = (scheduler, rid)
    times: dict[str, dict[int, list[float]]] = {"recompute": {L: [] for L in contexts},
                                                "kv_cache": {L: [] for L in contexts}}
    for k in range(repeats):
        for L in contexts:
            recompute = RecomputeGenerator(engine).next_token
            times["recompute"][L].append(_timed_ms(cuda, recompute, ids[L][: L + 1 + k]))
            times["kv_cache"][L].append(_timed_ms(cuda, engine.step, schedulers[L][0]))
    for scheduler, rid in schedulers.values():
        scheduler.discard_request(rid)  # frees its blocks
    return times
