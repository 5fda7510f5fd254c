"""The notebooks' exercise checks must pass the solutions and fail the wrong answers a learner writes."""

from __future__ import annotations

import hashlib
import itertools

from roseinfer.bench.exercises import check_prefix_router
from roseinfer.bench.solutions import prefix_router


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
