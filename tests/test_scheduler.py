"""OnlineScheduler: exact continuous batching, preemption, prefix cache, no leaks."""

from __future__ import annotations

import random

import pytest

from roseinfer import InvalidRequestError, SamplingParams


def _workload(n: int, seed: int = 0, max_prompt: int = 90, max_new: int = 30):
    rng = random.Random(seed)
    return [
        ([rng.randrange(50000) for _ in range(rng.randint(1, max_prompt))], rng.randint(1, max_new))
        for _ in range(n)
    ]


def _params(max_new_tokens: int, **fields) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, stop_on_eos=False, **fields)


def _solo(engine, workload):
    return [
        engine.generate([ids], SamplingParams(max_new_tokens=m, stop_on_eos=False))[0].token_ids
        for ids, m in workload
    ]


def _run_staggered(engine, scheduler, workload, seed=0):
    """Add requests at random steps while others run; collect what step() returns."""
    rng = random.Random(seed)
    arrivals = sorted(rng.randrange(0, 40) for _ in workload)
    rids, streamed = {}, {}
    step = 0
    while len(rids) < len(workload) or scheduler.has_unfinished():
        while len(rids) < len(workload) and arrivals[len(rids)] <= step:
            i = len(rids)
            ids, m = workload[i]
            rids[i] = engine.add_request(scheduler, prompt_token_ids=ids, params=_params(m))
        for rid, token in engine.step(scheduler).items():
            streamed.setdefault(rid, []).append(token)
        step += 1
        assert step < 10_000
    outputs = [scheduler.pop_response(rids[i]) for i in range(len(workload))]
    return outputs, [streamed[rids[i]] for i in range(len(workload))]


@pytest.mark.parametrize("num_kv_blocks, expect_preemption", [(512, False), (20, True)])
def test_staggered_requests_get_their_solo_tokens(make_engine, num_kv_blocks, expect_preemption):
    engine = make_engine(num_kv_blocks=num_kv_blocks)
    workload = _workload(24, seed=num_kv_blocks)
    solo = _solo(engine, workload)
    scheduler = engine.new_scheduler(max_batch_size=8, max_num_batched_tokens=128)
    outputs, streamed = _run_staggered(engine, scheduler, workload)
    assert [o.token_ids for o in outputs] == solo
    assert streamed == solo  # step() reported every token, the prefill's first one included
    assert all(o.finish_reason == "length" for o in outputs)
    stats = scheduler.kv_stats()
    assert (stats["num_preemptions"] > 0) == expect_preemption
    assert stats["used_blocks"] == 0
    assert not scheduler.has_unfinished()


def test_prefix_cache_gives_the_same_tokens_and_counts_hits(make_engine):
    engine = make_engine(num_kv_blocks=256)
    system = list(range(1000, 1050))  # 50 shared tokens: 3 full blocks of 16
    workload = [(system + [2000 + i, 3000 + i], 12) for i in range(6)]
    solo = _solo(make_engine(num_kv_blocks=256, enable_prefix_cache=False), workload)
    cached = engine.new_scheduler(enable_prefix_cache=True)
    outputs, _ = _run_staggered(engine, cached, workload)
    assert [o.token_ids for o in outputs] == solo
    stats = cached.kv_stats()
    assert stats["prefix_cache_hits"] >= 48 * (len(workload) - 1)
    assert stats["prefix_cache_queries"] == sum(len(ids) for ids, _ in workload)
    assert sum(o.metrics.num_cached_tokens > 0 for o in outputs) >= len(workload) - 1
    other = make_engine(num_kv_blocks=256)
    uncached = other.new_scheduler(enable_prefix_cache=False)
    outputs_nc, _ = _run_staggered(other, uncached, workload)
    assert [o.token_ids for o in outputs_nc] == solo
    assert uncached.kv_stats()["prefix_cache_hits"] == 0


def test_full_prompt_hit_still_computes_the_last_token(make_engine):
    engine = make_engine(num_kv_blocks=64)
    prompt = list(range(500, 532))  # exactly two blocks
    first = engine.generate([prompt], SamplingParams(max_new_tokens=5, stop_on_eos=False))[0]
    again = engine.generate([prompt], SamplingParams(max_new_tokens=5, stop_on_eos=False))[0]
    assert again.token_ids == first.token_ids
    assert again.metrics.num_cached_tokens == 16  # the last block holds the token we need logits for


def test_prefix_cache_under_eviction_pressure(make_engine):
    engine = make_engine(num_kv_blocks=24)
    workload = [([7] * 40 + [i] * 9, 20) for i in range(10)] + _workload(10, seed=5)
    solo = _solo(make_engine(num_kv_blocks=256, enable_prefix_cache=False), workload)
    scheduler = engine.new_scheduler(max_batch_size=6, max_num_batched_tokens=64)
    outputs, _ = _run_staggered(engine, scheduler, workload, seed=3)
    assert [o.token_ids for o in outputs] == solo
    assert scheduler.kv_stats()["used_blocks"] == 0


def test_chunked_prefill_equals_single_prefill(make_engine):
    engine = make_engine(num_kv_blocks=128)
    workload = _workload(5, seed=11, max_prompt=200)
    solo = _solo(engine, workload)
    scheduler = engine.new_scheduler(max_num_batched_tokens=7, enable_prefix_cache=False)
    outputs, _ = _run_staggered(engine, scheduler, workload)
    assert [o.token_ids for o in outputs] == solo
    long_one = max(range(5), key=lambda i: len(workload[i][0]))
    assert outputs[long_one].metrics.num_steps >= len(workload[long_one][0]) // 7


def test_prefill_happens_in_step_not_in_add_request(engine):
    scheduler = engine.new_scheduler()
    rid = engine.add_request(scheduler, prompt="Hello there", params=_params(3))
    assert scheduler.kv_stats()["used_blocks"] == 0
    assert scheduler.get_generated_ids(rid) == []
    first = engine.step(scheduler)
    assert list(first) == [rid]
    assert scheduler.get_generated_ids(rid) == [first[rid]]
    assert scheduler.get_step_count(rid) == 1
    while scheduler.has_unfinished():
        engine.step(scheduler)
    assert scheduler.is_finished(rid)
    assert scheduler.pop_finished_ids() == [rid]
    assert scheduler.pop_finished_ids() == []
    assert scheduler.pop_response(rid).finish_reason == "length"
    with pytest.raises(KeyError):
        scheduler.is_finished(rid)


def test_generated_ids_are_a_copy(engine):
    scheduler = engine.new_scheduler()
    rid = engine.add_request(scheduler, prompt="Copy me", params=_params(4))
    engine.step(scheduler)
    ids = scheduler.get_generated_ids(rid)
    ids.append(-1)
    ids.clear()
    assert len(scheduler.get_generated_ids(rid)) == 1
    while scheduler.has_unfinished():
        engine.step(scheduler)
    assert len(scheduler.pop_response(rid).token_ids) == 4


def test_discard_frees_running_and_waiting_requests(make_engine):
    engine = make_engine(num_kv_blocks=64)
    scheduler = engine.new_scheduler(max_batch_size=2)
    rids = [engine.add_request(scheduler, prompt_token_ids=[i + 1] * 30, params=SamplingParams(max_new_tokens=50)) for i in range(4)]
    for _ in range(3):
        engine.step(scheduler)
    assert scheduler.num_running() == 2 and scheduler.num_waiting() == 2
    assert scheduler.kv_stats()["used_blocks"] > 0
    for rid in rids:
        assert scheduler.discard_request(rid)
    assert not scheduler.discard_request(rids[0])
    assert not scheduler.has_unfinished()
    assert scheduler.kv_stats()["used_blocks"] == 0
    assert engine.step(scheduler) == {}


def test_requests_that_cannot_fit_are_refused_up_front(make_engine):
    engine = make_engine(num_kv_blocks=4)  # 64 token slots
    scheduler = engine.new_scheduler()
    with pytest.raises(InvalidRequestError, match="needs 5 KV blocks .* 4"):
        engine.add_request(scheduler, prompt_token_ids=[1] * 60, params=SamplingParams(max_new_tokens=10))
    rid = engine.add_request(scheduler, prompt_token_ids=[1] * 60, params=SamplingParams(max_new_tokens=5))  # 64 slots: fits
    while scheduler.has_unfinished():
        engine.step(scheduler)
    assert len(scheduler.pop_response(rid).token_ids) == 5
    with pytest.raises(InvalidRequestError):
        engine.add_request(scheduler, prompt="x", prompt_token_ids=[1])
    with pytest.raises(InvalidRequestError, match="top_p"):
        engine.add_request(scheduler, prompt="x", params=SamplingParams(top_p=2.0))
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request(scheduler, prompt="x", request_id=7)
        engine.add_request(scheduler, prompt="y", request_id=7)


def test_a_tiny_pool_never_deadlocks(make_engine):
    """Every request needs most of the pool: they run one after another via preemption."""
    engine = make_engine(num_kv_blocks=6)
    workload = [([i + 3] * 40, 50) for i in range(5)]
    solo = _solo(engine, workload)
    scheduler = engine.new_scheduler(max_batch_size=5)
    outputs, _ = _run_staggered(engine, scheduler, workload)
    assert [o.token_ids for o in outputs] == solo
    assert scheduler.kv_stats()["num_preemptions"] > 0
    assert scheduler.kv_stats()["used_blocks"] == 0


def test_sampled_requests_keep_their_seeded_tokens_in_a_batch(make_engine):
    engine = make_engine(num_kv_blocks=20)
    params = dict(max_new_tokens=25, temperature=0.8, top_p=0.9, stop_on_eos=False)
    workload = _workload(8, seed=2, max_prompt=60)
    solo = [
        engine.generate([ids], SamplingParams(seed=i, **params))[0].token_ids
        for i, (ids, _) in enumerate(workload)
    ]
    scheduler = engine.new_scheduler(max_batch_size=8)
    rids = [
        engine.add_request(scheduler, prompt_token_ids=ids, params=SamplingParams(seed=i, **params))
        for i, (ids, _) in enumerate(workload)
    ]
    while scheduler.has_unfinished():
        engine.step(scheduler)
    assert [scheduler.pop_response(r).token_ids for r in rids] == solo
    assert scheduler.kv_stats()["num_preemptions"] > 0  # preemption keeps the random stream too


def test_prefill_max_batch_size_caps_admissions_per_step(make_engine):
    engine = make_engine(num_kv_blocks=128, prefill_max_batch_size=2)
    workload = [(ids, 6) for ids, _ in _workload(5, seed=3, max_prompt=20)]
    solo = _solo(engine, workload)
    scheduler = engine.new_scheduler(enable_prefix_cache=False)
    assert scheduler.limits.max_prefills_per_step == 2  # from the engine's config
    rids = [
        engine.add_request(scheduler, prompt_token_ids=ids, params=_params(m)) for ids, m in workload
    ]
    sizes = []
    while scheduler.has_unfinished():
        engine.step(scheduler)
        sizes.append(scheduler.last_step_stats()["batch_size"])
    assert sizes[:3] == [2, 4, 5]  # two new prompts a step, the earlier ones decoding alongside
    assert [scheduler.pop_response(r).token_ids for r in rids] == solo


def test_the_scheduler_is_a_policy_that_runs_without_a_model():
    """schedule() and update() need only a block pool: any 'runner' can answer a batch."""
    from roseinfer.engine.block_manager import BlockManager
    from roseinfer.engine.scheduler import OnlineScheduler, SchedulerLimits
    from roseinfer.engine.sequence import Request

    eos = 99
    scheduler = OnlineScheduler(BlockManager(8, 4), SchedulerLimits(max_num_batched_tokens=6), frozenset({eos}))
    a = scheduler.add_request(Request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=3)))
    b = scheduler.add_request(Request([6, 7], SamplingParams(max_new_tokens=5)))
    first = scheduler.schedule()
    # a's 5 prompt tokens fit the budget of 6; b gets the last token of budget: a 1-token chunk.
    assert [(seq.request_id, n) for seq, n in first.scheduled] == [(a, 5), (b, 1)]
    assert [e.sample for e in first.entries] == [True, False]
    assert scheduler.update(first, [10, None]) == []
    second = scheduler.schedule()
    assert [(seq.request_id, n) for seq, n in second.scheduled] == [(a, 1), (b, 1)]
    assert scheduler.update(second, [eos, 20]) == [a]  # EOS ends a, counted as generated
    assert scheduler.pop_response(a).token_ids == [10, eos]
    scheduler.finish_request(b)  # b's reader saw a stop string
    assert scheduler.pop_finished_ids() == [a, b]
    out = scheduler.pop_response(b)
    assert (out.token_ids, out.finish_reason) == ([20], "stop")
    assert scheduler.kv_stats()["used_blocks"] == 0 and not scheduler.schedule()


def test_stop_strings_have_one_owner_and_free_the_request_at_once(engine):
    params = SamplingParams(max_new_tokens=40, stop_on_eos=False)
    full = engine.generate(["Stop somewhere"], params)[0]
    stop = full.text[len(full.text) // 2 :][:3]
    assert stop.strip(), "the random model's text should have a middle"
    cut = engine.generate(["Stop somewhere"], SamplingParams(max_new_tokens=40, stop_on_eos=False, stop=[stop]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)] and len(cut.token_ids) < 40
    assert engine.block_manager.num_used_blocks == 0
    # The scheduler never sees text: it has no tokenizer to detokenize with.
    assert not any("tokenizer" in name for name in vars(engine.new_scheduler()))


def test_validate_fills_the_context_when_no_length_is_asked(make_engine):
    engine = make_engine(num_kv_blocks=128)
    request = engine.validate(prompt_token_ids=[5] * 10, params=SamplingParams(max_new_tokens=None))
    assert request.params.max_new_tokens == engine.max_model_len - 10
    with pytest.raises(InvalidRequestError, match="fills the model's context"):
        engine.validate(prompt_token_ids=[5] * engine.max_model_len, params=SamplingParams(max_new_tokens=None))
