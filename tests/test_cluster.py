"""Two roseinfer replicas behind SMG (python -m roseinfer.cluster's Cluster): the gateway changes no answer,
routes shared prefixes to one replica under cache_aware and spreads them under round_robin, reads the
replicas' own loads, and a replica stopped under load loses no request."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import httpx
import pytest

from live_server import free_port
from roseinfer.cluster import Cluster, Started, core_shares, gateway_command, stop, wait_gateway

pytest.importorskip("smg", reason="the gateway: pip install roseinfer[cluster]")

MODEL = "gpt2-tiny"
SHARED = "You are the support assistant of a shop that sells bicycles. Answer briefly and politely. " * 4


def test_cores_are_split_into_contiguous_shares():
    assert core_shares([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert core_shares([0, 1, 2], 2) == [[0], [1, 2]]
    assert core_shares([0, 1], 3) == [[0], [1], [0]]  # more replicas than cores: they share round the ring


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("cluster")
    with Cluster(2, ["--model", MODEL, "--num-kv-blocks", "256"], free_port(), "cache_aware", log_dir=str(logs),
                 drain_timeout=20) as running:
        yield running


def served(replica: str) -> float:
    """Requests this replica finished (its Prometheus counter)."""
    text = httpx.get(replica + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("roseinfer:request_success_total"))


def greedy(base: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(base + path, json={"model": MODEL, "temperature": 0, **body}, timeout=60)


def test_through_the_gateway_the_answers_are_the_replicas(cluster):
    direct = cluster.workers[0].url
    completion = {"prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12}
    for path, body, text in (("/v1/completions", completion, lambda r: r["choices"][0]["text"]),
                             ("/v1/chat/completions", chat, lambda r: r["choices"][0]["message"]["content"])):
        via, own = greedy(cluster.url, path, body), greedy(direct, path, body)
        assert via.status_code == own.status_code == 200, via.text
        assert text(via.json()) == text(own.json())
    stream = greedy(cluster.url, "/v1/completions", {**completion, "stream": True})
    pieces = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
    assert "".join(p["choices"][0]["text"] for p in pieces) == greedy(direct, "/v1/completions", completion).json()[
        "choices"][0]["text"]
    assert stream.text.rstrip().endswith("data: [DONE]")
    tagged = greedy(cluster.url, "/v1/completions", {**completion, "max_tokens": 2})
    assert tagged.headers.get("x-request-id")  # the replica's id, passed back through the gateway


def share_of_one_replica(gateway: str, replicas: list[str], tag: str, n: int = 20) -> list[float]:
    before = [served(r) for r in replicas]
    for i in range(n):
        response = greedy(gateway, "/v1/completions", {"prompt": SHARED + f"{tag} customer {i} asks:", "max_tokens": 2})
        assert response.status_code == 200
    return [served(r) - b for r, b in zip(replicas, before)]


def test_cache_aware_keeps_a_shared_prefix_on_one_replica_and_round_robin_spreads_it(cluster):
    replicas = [w.url for w in cluster.workers]
    counts = share_of_one_replica(cluster.url, replicas, "cache-aware")
    assert max(counts) >= 18, counts
    port = free_port()
    rr = Started("round-robin gateway", f"http://127.0.0.1:{port}",
                 subprocess.Popen(gateway_command(port, replicas, "round_robin"), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.STDOUT))
    try:
        wait_gateway(rr, 2, 60)
        counts = share_of_one_replica(rr.url, replicas, "round-robin")
        assert min(counts) >= 8, counts
    finally:
        stop([rr], 10)


def test_the_gateway_reads_each_replicas_own_load(cluster):
    pool = {w.url: httpx.get(w.url + "/v1/loads").json()["loads"][0]["max_total_num_tokens"] for w in cluster.workers}
    body = {"prompt": "busy " * 30, "max_tokens": 120, "ignore_eos": True}
    senders = [threading.Thread(target=greedy, args=(cluster.url, "/v1/completions", body)) for _ in range(6)]
    for s in senders:
        s.start()
    for s in senders:
        s.join()
    seen = []
    deadline = time.monotonic() + 15  # the gateway reads /v1/loads every second; the rate spans 10 s
    while time.monotonic() < deadline and not seen:
        for worker in httpx.get(cluster.url + "/workers").json()["workers"]:
            [load] = (worker.get("engine_load") or {"loads": [{}]})["loads"]
            if load.get("gen_throughput", 0) > 0 and load.get("max_total_num_tokens") == pool[worker["url"]]:
                seen.append(load)  # the replica's own figures (its KV pool, its rate), not the gateway's defaults
        time.sleep(0.2)
    assert seen, "the gateway never showed a replica's load"


def test_a_replica_stopped_under_load_loses_no_request(tmp_path):
    with Cluster(2, ["--model", MODEL, "--num-kv-blocks", "256"], free_port(), "round_robin",
                 log_dir=str(tmp_path), drain_timeout=20) as running:
        results: dict[int, tuple[int, str]] = {}

        def ask(i: int) -> None:
            body = {"prompt": f"request {i}:", "max_tokens": 60, "ignore_eos": True, "stream": i % 3 == 0}
            r = greedy(running.url, "/v1/completions", body)
            results[i] = (r.status_code, r.text)

        senders = [threading.Thread(target=ask, args=(i,)) for i in range(18)]
        for i, s in enumerate(senders):
            s.start()
            if i == 8:  # half sent, some running on the replica about to stop
                running.workers[0].proc.send_signal(signal.SIGTERM)
            time.sleep(0.02)
        for s in senders:
            s.join()
        assert running.workers[0].proc.wait(timeout=30) == 0
        assert sorted(results) == list(range(18))
        for i, (status, text) in results.items():
            assert status == 200, (i, text)
            if i % 3 == 0:  # streams: ended by their own length, not by the stop
                assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text, (i, text[-300:])
            else:
                assert json.loads(text)["usage"]["completion_tokens"] == 60
