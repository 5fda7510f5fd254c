"""The notebooks' exercise checks must pass the solutions and fail the wrong answers a learner writes."""

from __future__ import annotations

import hashlib
import itertools

import torch

from roseinfer.bench.exercises import check_gqa_decode, check_kv_cache_attention, check_prefix_router
from roseinfer.bench.solutions import gqa_decode, kv_cache_attention, prefix_router


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
