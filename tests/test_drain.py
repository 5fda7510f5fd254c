"""A drain loses nothing it admitted: the manager's drain() under load, in-process (tests/test_server_cli.py
sends the process SIGTERM and POST /admin/drain)."""

from __future__ import annotations

import json
import threading
import time

import httpx

from live_server import MODEL, make_server, slowed_down
from roseinfer import InferenceEngine


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def stream_completion(base: str, body: dict, out: list) -> None:
    with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        out.append([json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")])


def test_a_drain_finishes_every_admitted_request_and_refuses_new_ones(hf_tiny_dir):
    engine = slowed_down(InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64, max_batch_size=2),
                         0.01)
    with make_server(engine) as live:
        base, manager = live.base_url, live.manager
        body = {"model": MODEL, "prompt": "drain me", "max_tokens": 30, "ignore_eos": True}
        results: list = []
        clients = [threading.Thread(target=stream_completion, args=(base, body, results)) for _ in range(4)]
        for c in clients:  # 4 streams for 2 slots: two run, two wait, all four are admitted
            c.start()
        wait_until(lambda: manager.stats()["inflight_requests"] == 4)
        drained: list[bool] = []
        drainer = threading.Thread(target=lambda: drained.append(manager.drain(timeout=60)))
        drainer.start()
        wait_until(lambda: manager.draining)
        health = httpx.get(base + "/health")
        assert health.status_code == 503 and health.headers["retry-after"] == "1"
        refused = httpx.post(base + "/v1/completions", json=body)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "another replica" in refused.json()["error"]["message"]
        drainer.join(timeout=60)
        for c in clients:
            c.join(timeout=60)
        assert drained == [True]
        assert len(results) == 4
        for chunks in results:  # each ran to its own end: 30 tokens, no error event
            assert not any("error" in c for c in chunks)
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_drain_that_runs_out_of_time_says_so(hf_tiny_dir):
    engine = slowed_down(InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64), 0.05)
    with make_server(engine) as live:
        results: list = []
        body = {"model": MODEL, "prompt": "slow", "max_tokens": 200, "ignore_eos": True}
        client = threading.Thread(target=stream_completion, args=(live.base_url, body, results))
        client.start()
        wait_until(lambda: live.manager.stats()["inflight_requests"] == 1)
        assert live.manager.drain(timeout=0.2) is False  # still running: the caller ends it (close)
        live.manager.close(timeout=2.0)
        client.join(timeout=30)
        assert "shutting down" in results[0][-1]["error"]["message"]
