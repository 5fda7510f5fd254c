"""The notebooks' exercise checks must pass the solutions and fail the wrong answers a learner writes."""

from __future__ import annotations

import hashlib
import itertools

import pytest
import torch

from roseinfer.bench.exercises import check_generated_ids, check_gqa_decode, check_kv_cache_attention, check_prefix_router
from roseinfer.bench.solutions import get_generated_ids, gqa_decode, kv_cache_attention, prefix_router


def test_prefix_router_solution_passes():
    assert check_prefix_router(prefix_router).startswith("PASS")


def test_prefix_router_unwritten_says_so():
    def unwritten(prompt, replicas):
        raise NotImplementedError

    assert check_prefix_router(unwritten).startswith("not written yet")


def test_prefix_router_round_robin_fails():
    turn = itertools.count()
    assert "several replicas" in check_prefix_router(lambda prompt, replicas: replicas[next(turn) % len(replicas)])


def test_prefix_router_one_replica_fails():
    assert "one replica would do all the work" in check_prefix_router(lambda prompt, replicas: replicas[0])


def test_prefix_router_whole_prompt_hash_fails():
    # hashing the whole prompt (question included) is the usual first try: it scatters one system prompt's users
    def whole_prompt(prompt, replicas):
        return replicas[int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % len(replicas)]

    assert "several replicas" in check_prefix_router(whole_prompt)


def test_prefix_router_unknown_replica_fails():
    assert "not given" in check_prefix_router(lambda prompt, replicas: "http://elsewhere")


def test_gqa_decode_solution_passes_and_wrong_answers_fail():
    assert check_gqa_decode(gqa_decode).startswith("PASS")

    def unwritten(q, k, v, scale):
        raise NotImplementedError

    def interleaved(q, k, v, scale):  # k.repeat instead of repeat_interleave: head h reads h % kv_heads
        group = q.shape[0] // k.shape[1]
        k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)
        return (((k * q).sum(-1) * scale).softmax(dim=0)[..., None] * v).sum(0)

    def unscaled(q, k, v, scale):
        return gqa_decode(q, k, v, 1.0)

    assert check_gqa_decode(unwritten).startswith("not written yet")
    assert "h // group" in check_gqa_decode(interleaved)
    assert "off by" in check_gqa_decode(unscaled)
    assert "shape" in check_gqa_decode(lambda q, k, v, scale: q[:1])


def test_kv_cache_attention_solution_passes_and_wrong_answers_fail():
    assert check_kv_cache_attention(kv_cache_attention).startswith("PASS")

    def unwritten(cache, x, project, scale):
        raise NotImplementedError

    def recomputes(cache, x, project, scale):  # right answers, without a cache: every step projects every token
        cache["xs"] = torch.cat([cache["xs"], x[None]]) if cache else x[None]
        q, k, v = project(cache["xs"])
        return torch.softmax(k @ q[-1] * scale, dim=0) @ v

    def forgets(cache, x, project, scale):  # attends to the new token alone
        return kv_cache_attention({}, x, project, scale)

    def unscaled(cache, x, project, scale):
        return kv_cache_attention(cache, x, project, 1.0)

    assert check_kv_cache_attention(unwritten).startswith("not written yet")
    assert "recomputed" in check_kv_cache_attention(recomputes)
    assert "alone" in check_kv_cache_attention(forgets)
    assert "off by" in check_kv_cache_attention(unscaled)


def test_generated_ids_solution_passes():
    assert check_generated_ids(get_generated_ids).startswith("PASS")


def test_generated_ids_unwritten_says_so():
    def unwritten(scheduler, request_id):
        raise NotImplementedError

    assert check_generated_ids(unwritten).startswith("not written yet")


def test_generated_ids_live_list_fails():
    # the private reference itself, the "before" of notebook 06: right values, but the scheduler's own list
    def live(scheduler, request_id):
        return scheduler._requests[request_id].output_token_ids

    assert "return a copy" in check_generated_ids(live)


def test_generated_ids_wrong_answers_fail():
    def first_request(scheduler, request_id):  # the id ignored: whichever request comes first
        return list(next(iter(scheduler._requests.values())).output_token_ids)

    def by_position(scheduler, request_id):  # the id taken for a position in the running list
        return list(scheduler._running[request_id % len(scheduler._running)].output_token_ids)

    def with_prompt(scheduler, request_id):  # a new list, but the prompt's ids with the output's
        seq = scheduler._requests[request_id]
        return seq.prompt_token_ids + seq.output_token_ids

    def as_tuple(scheduler, request_id):
        return tuple(scheduler._requests[request_id].output_token_ids)

    assert "look the request up by its id" in check_generated_ids(first_request)
    assert "look the request up by its id" in check_generated_ids(by_position)
    assert "came with its prompt" in check_generated_ids(with_prompt)
    assert "expected a list" in check_generated_ids(as_tuple)


def test_generated_ids_stale_copy_fails():
    kept: dict[int, list[int]] = {}

    def remembered(scheduler, request_id):  # a copy taken once, then handed out again
        if request_id not in kept:
            kept[request_id] = list(scheduler._requests[request_id].output_token_ids)
        return kept[request_id]

    assert "read the request at each call" in check_generated_ids(remembered)


def test_generated_ids_unknown_id_must_raise_key_error():
    def empty_for_unknown(scheduler, request_id):  # hides a wrong id behind an empty answer
        seq = scheduler._requests.get(request_id)
        return list(seq.output_token_ids) if seq else []

    def none_for_unknown(scheduler, request_id):  # .get() then an attribute of None: AttributeError
        return list(scheduler._requests.get(request_id).output_token_ids)

    assert "does not exist, yet it returned []" in check_generated_ids(empty_for_unknown)
    assert "raised AttributeError" in check_generated_ids(none_for_unknown)


def test_generated_ids_calling_the_schedulers_accessor_fails():
    assert "own get_generated_ids" in check_generated_ids(lambda s, rid: s.get_generated_ids(rid))


# --- roseinfer/bench/accessors.py (notebook 06's measurements) ---------------------------------------------


def test_split_calls_at_the_factor():
    from roseinfer.bench.accessors import split_calls

    assert split_calls([1.0, 2.0, 3.0, 3.1, 10.0], alone=2.0) == ([1.0, 2.0, 3.0], [3.1, 10.0])
    assert split_calls([], alone=2.0) == ([], [])


def test_copy_cost_and_quiet_pop_leave_no_request_behind():
    from roseinfer import InferenceEngine
    from roseinfer.bench.accessors import copy_cost_ns, quiet_pop_us

    engine = InferenceEngine.from_pretrained("gpt2-tiny", dtype="float32")
    free = engine.block_manager.num_free_blocks
    cost = copy_cost_ns(engine, [4, 2000], reps=50, repeat=2)  # 2,000: past gpt2-tiny's 1,024 positions, uncomputed
    assert sorted(cost) == [4, 2000]
    assert all(c["private_ns"] > 0 and c["accessor_ns"] > 0 for c in cost.values())
    assert quiet_pop_us(engine, lambda s, rid: s.pop_response(rid), "Hello", new_tokens=2, count=3) > 0
    assert engine.block_manager.num_free_blocks == free


def test_serve_interleaved_times_one_pop_a_request():
    from roseinfer import InferenceEngine
    from roseinfer.bench.accessors import serve_interleaved
    from roseinfer.bench.streaming import StreamingSetup

    engine = InferenceEngine.from_pretrained("gpt2-tiny", dtype="float32")
    setup = StreamingSetup(num_requests=2, prompt="Hello", pretok=True, max_new_tokens=2, stop_on_eos=False)
    runs, calls = serve_interleaved(engine, ["private-state", "current"], setup, repeats=2)
    assert {v: len(r) for v, r in runs.items()} == {"private-state": 2, "current": 2}
    assert {v: len(c) for v, c in calls.items()} == {"private-state": 4, "current": 4}  # 2 runs x 2 requests
    assert all(r["tok_s"] > 0 and r["pop_median_us"] > 0 for rs in runs.values() for r in rs)


def test_plot_accessors_draws_three_panels():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from roseinfer.bench.accessors import plot_accessors

    names = {"private-state": "private state", "current": "public accessors"}
    cost = {16: {"private_ns": 40.0, "accessor_ns": 180.0}, 1000: {"private_ns": 42.0, "accessor_ns": 1400.0}}
    calls = {"private-state": [1.0, 2.0], "current": [2.0, 9.0]}
    runs = {v: [{"tok_s": 3000.0}, {"tok_s": 3100.0}] for v in names}
    fig = plot_accessors(cost, calls, 1.9, runs, names, "2 streams x 2 tokens")
    try:
        assert len(fig.axes) == 3
        assert [t.get_text() for t in fig.axes[2].get_xticklabels()] == list(names.values())
    finally:
        plt.close(fig)
