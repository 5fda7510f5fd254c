"""GET /v1/loads, the load report a gateway (SMG) routes on: its schema, and that it follows the engine."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from live_server import MODEL, make_server, slowed_down
from roseinfer import InferenceEngine
from roseinfer.server.loads import RATE_WINDOW_S, GenerationMarks, generation_rate, load_report

# SMG's SchedulerLoadSnapshot: these counts must be integers (a float fails its parse, and SMG then
# treats the worker as having no /v1/loads until it is replaced), the rest numbers.
INTEGER_FIELDS = ("dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens", "num_total_reqs",
                  "num_used_tokens", "max_total_num_tokens", "max_running_requests")
FLOAT_FIELDS = ("token_usage", "gen_throughput", "cache_hit_rate", "utilization")


def test_the_generation_rate_is_over_the_recent_window():
    marks = GenerationMarks()
    seen = ()
    for second in range(31):  # 10 tokens a second for 30 s
        seen = marks.add(float(second), 10 * second)
    assert generation_rate(seen, 30.0) == pytest.approx(10.0)
    assert len(seen) <= RATE_WINDOW_S + 2  # the marks do not grow with the run
    assert generation_rate(seen, 30.0 + RATE_WINDOW_S + 1) == 0.0  # idle for a whole window: no rate
    assert generation_rate((), 5.0) == 0.0


def test_a_report_from_a_manager_without_the_newer_counters_is_still_valid():
    report = load_report({"num_running": 1, "num_waiting": 2})  # a history variant's stats
    [rank] = report["loads"]
    assert rank["num_total_reqs"] == 3 and rank["token_usage"] == 0.0
    assert all(type(rank[f]) is int for f in INTEGER_FIELDS) and all(type(rank[f]) is float for f in FLOAT_FIELDS)


def test_the_loads_of_a_busy_worker_are_its_own(hf_tiny_dir):
    engine = slowed_down(InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64, max_batch_size=4),
                         0.02)
    with make_server(engine) as live:
        base = live.base_url
        idle = httpx.get(base + "/v1/loads").json()
        assert idle["dp_rank_count"] == 1 and isinstance(idle["timestamp"], str)
        [rank] = idle["loads"]
        assert all(type(rank[f]) is int for f in INTEGER_FIELDS) and all(type(rank[f]) is float for f in FLOAT_FIELDS)
        blocks = live.manager.stats()
        assert rank["max_total_num_tokens"] == blocks["total_blocks"] * blocks["block_size"]
        assert rank["max_running_requests"] == 4 and rank["num_running_reqs"] == 0

        body = {"model": MODEL, "prompt": "busy " * 20, "max_tokens": 40, "ignore_eos": True}
        senders = [threading.Thread(target=httpx.post, args=(base + "/v1/completions",),
                                    kwargs={"json": body, "timeout": 60}) for _ in range(8)]
        for s in senders:
            s.start()
        busy = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # 8 requests for 4 slots: some run, the others wait
            [rank] = httpx.get(base + "/v1/loads").json()["loads"]
            if rank["num_running_reqs"] == 4 and rank["num_waiting_reqs"] > 0 and rank["gen_throughput"] > 0:
                busy = rank
                break
            time.sleep(0.05)
        for s in senders:
            s.join()
        assert busy is not None, "never saw the worker busy"
        assert busy["num_total_reqs"] == busy["num_running_reqs"] + busy["num_waiting_reqs"]
        assert busy["num_waiting_uncached_tokens"] >= busy["num_waiting_reqs"] * 20  # their prompts still to prefill
        assert 0 < busy["token_usage"] <= 1 and busy["num_used_tokens"] > 0 and busy["utilization"] == 1.0
        [after] = httpx.get(base + "/v1/loads").json()["loads"]
        assert after["num_running_reqs"] == after["num_waiting_reqs"] == 0
        assert after["cache_hit_rate"] > 0  # eight copies of one prompt: the later ones found its blocks


# The bodies SMG (1.9 source: model_gateway/src/routers/http/request_body.rs and crates/protocols) sends a generic
# worker after re-serializing a client's request: None fields dropped, max_tokens moved to max_completion_tokens in
# chat, logprobs / echo / stream / skip_special_tokens always written, floats widened from f32.
SMG_COMPLETION = {"model": MODEL, "prompt": "hi", "echo": False, "max_tokens": 4, "stream": False,
                  "skip_special_tokens": True, "temperature": 0.0}
SMG_CHAT = {"messages": [{"role": "user", "content": "hi"}], "model": MODEL, "logprobs": False,
            "max_completion_tokens": 4, "stream": False, "temperature": 0.699999988079071, "seed": 7,
            "skip_special_tokens": True}


def test_the_bodies_smg_sends_are_served(hf_tiny_dir):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64)
    with make_server(engine) as live:
        base = live.base_url
        completion = httpx.post(base + "/v1/completions", json=SMG_COMPLETION)
        assert completion.status_code == 200, completion.text
        assert completion.json()["usage"]["completion_tokens"] == 4
        chat = httpx.post(base + "/v1/chat/completions", json=SMG_CHAT)
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] <= 4
        # a client's streaming request, with the usage chunk SMG's clients ask for
        streamed = httpx.post(base + "/v1/chat/completions",
                              json={**SMG_CHAT, "stream": True, "stream_options": {"include_usage": True}})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        # what no generic worker can honour is still refused clearly, not served wrongly
        tools = {**SMG_CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}
        refused = httpx.post(base + "/v1/chat/completions", json=tools)
        assert refused.status_code == 400 and refused.json()["error"]["param"] in ("tools", "tool_choice")


def test_no_vllm_or_sglang_discovery_routes(hf_tiny_dir):
    """SMG asks /version and /server_info to tell vLLM and SGLang workers apart; a worker that answered would be
    driven as one of them. roseinfer answers 404 to both, so SMG keeps it a generic OpenAI worker."""
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=16)
    with make_server(engine) as live:
        for path in ("/version", "/server_info", "/get_server_info"):
            assert httpx.get(live.base_url + path).status_code == 404, path
