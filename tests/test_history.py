"""The earlier versions kept for the notebooks: same answers, and the flaws they are kept to show."""

from __future__ import annotations

import queue
import threading

from roseinfer import SamplingParams
from roseinfer.bench.batching import run_continuous, run_one_at_a_time, run_static
from roseinfer.bench.workloads import mixed_output_lengths
from roseinfer.history.clear_outside_lock import ClearOutsideLockManager
from roseinfer.history.no_kv_cache import KVCacheGenerator, RecomputeGenerator
from roseinfer.server.manager import SchedulerManager


def test_recompute_generator_matches_the_kv_cache(engine):
    prompt = engine.tokenizer.encode("Recompute everything, every time")
    expected = engine.generate([prompt], SamplingParams(max_new_tokens=12, stop_on_eos=False))[0].token_ids
    assert RecomputeGenerator(engine).generate(prompt, 12) == expected
    assert KVCacheGenerator(engine).generate(prompt, 12) == expected
    assert engine.block_manager.num_used_blocks == 0


def test_one_at_a_time_static_and_continuous_agree(engine):
    requests = mixed_output_lengths(6, (3, 20), (2, 15), seed=4)
    _, alone, _ = run_one_at_a_time(engine, requests)
    _, static, info = run_static(engine, requests, 4)
    _, continuous, _ = run_continuous(engine, requests, 4)
    assert alone == static == continuous
    assert 0 < info["wasted_fraction"] < 1
    assert engine.block_manager.num_used_blocks == 0


class _UnderLockWithWindow(SchedulerManager):
    def __init__(self, *args, before_wait=None, **kwargs):
        self.before_wait = before_wait
        super().__init__(*args, **kwargs)

    def _wait_for_work(self):
        self.before_wait()
        super()._wait_for_work()


def _submit_in_window(engine, cls, hook: str) -> bool:
    """Submit exactly between the idle check and the wait; True if served without another request."""
    window, submitted = threading.Event(), threading.Event()

    def hold():
        if not submitted.is_set():
            window.set()
            submitted.wait()

    manager = cls(engine, **{hook: hold})
    try:
        assert window.wait(10)
        stream = manager.submit(prompt="hi", params=SamplingParams(max_new_tokens=1))
        submitted.set()
        try:
            list(stream.pieces(timeout=1.0))
            return True
        except queue.Empty:
            manager.submit(prompt="rescue", params=SamplingParams(max_new_tokens=1))
            list(stream.pieces(timeout=10))  # the next request wakes the worker: served late
            return False
    finally:
        manager.close()


def test_clearing_outside_the_lock_loses_the_wakeup_and_under_the_lock_does_not(engine):
    assert _submit_in_window(engine, ClearOutsideLockManager, "before_clear") is False
    assert _submit_in_window(engine, _UnderLockWithWindow, "before_wait") is True




def test_no_prefix_cache_scheduler_matches_the_cache_and_finds_nothing(engine):
    from roseinfer.bench.diff import source_diff
    from roseinfer.bench.scheduler_modes import SchedulerSetup, run_mode
    from roseinfer.bench.workloads import shared_prefix_prompts
    from roseinfer.engine.scheduler import OnlineScheduler
    from roseinfer.history.no_prefix_cache import NoPrefixCacheScheduler

    workload = shared_prefix_prompts(6, 40, 5, 4, num_prefixes=2, seed=3)
    params = [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in workload]

    def tokens(scheduler) -> list[list[int]]:
        ids = [engine.add_request(scheduler, prompt_token_ids=r.prompt_token_ids, params=p) for r, p in zip(workload, params)]
        while scheduler.has_unfinished():
            engine.step(scheduler)
        return [scheduler.pop_response(i).token_ids for i in ids]

    engine.block_manager.reset_prefix_cache()
    before = tokens(engine.new_scheduler(NoPrefixCacheScheduler, enable_prefix_cache=True))  # the option cannot turn it on
    engine.block_manager.reset_prefix_cache()
    assert before == tokens(engine.new_scheduler(enable_prefix_cache=False))
    engine.block_manager.reset_prefix_cache()
    assert before == tokens(engine.new_scheduler(enable_prefix_cache=True))

    # Arriving one after another, the later requests of a prefix find it only with the cache.
    for cls, expect_hits in ((NoPrefixCacheScheduler, False), (OnlineScheduler, True)):
        m = run_mode(engine, SchedulerSetup(scheduler_class=cls, enable_prefix_cache=True), "naive", workload, params)
        assert (sum(m["cached_tokens"]) > 0) is expect_hits
        assert len(m["ttfts_ms"]) == len(workload)
    assert engine.block_manager.num_used_blocks == 0

    diff = source_diff(NoPrefixCacheScheduler._admit, OnlineScheduler._admit)
    assert "+        hits, hashes = self._blocks.match_prefix(" in diff
    assert source_diff(OnlineScheduler._admit, OnlineScheduler._admit) == ""
