"""The HTTP API against a live uvicorn on 127.0.0.1, with the official openai client."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from live_server import MODEL, make_server, slowed_down
from roseinfer import InferenceEngine, SamplingParams


@pytest.fixture(scope="module")
def server(hf_tiny_dir):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=512)
    with make_server(engine, stream_interval=2) as live:
        yield live


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def solo_text(server, prompt_ids, n) -> str:
    engine = server.manager.engine
    return engine.generate([prompt_ids], SamplingParams(max_new_tokens=n, stop_on_eos=False))[0].text


def metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


# -- the openai client ----------------------------------------------------------------------
def test_completions_with_the_openai_client(server, client):
    prompt = "The meaning of life is"
    out = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    ids = server.manager.engine.tokenizer.encode(prompt)
    assert out.choices[0].text == solo_text(server, ids, 12)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 12
    assert out.usage.total_tokens == len(ids) + 12
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_chat_with_the_openai_client(server, client):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there! ¿Qué tal? 你好"},
    ]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0, seed=1)
    assert out.choices[0].message.role == "assistant"
    assert out.object == "chat.completion"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens


def test_stop_strings_and_seeded_sampling(server, client):
    prompt = "Tell me a story:"
    full = (
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=30, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    stop = full[12:15]
    cut = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert cut.choices[0].text == full[: full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    a = client.completions.create(model=MODEL, prompt=prompt, max_tokens=15, temperature=0.9, seed=5)
    b = client.completions.create(model=MODEL, prompt=prompt, max_tokens=15, temperature=0.9, seed=5)
    assert a.choices[0].text == b.choices[0].text


def test_a_batch_of_prompts_in_one_completion(server, client):
    prompts = ["One", "Two words", "Three words here"]
    out = client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    tok = server.manager.engine.tokenizer
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == [
        solo_text(server, tok.encode(p), 6) for p in prompts
    ]
    stream = client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=6, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    texts = ["", "", ""]
    for chunk in stream:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == [c.text for c in sorted(out.choices, key=lambda c: c.index)]


def test_64_concurrent_streams_all_complete_correctly(server):
    tok = server.manager.engine.tokenizer
    prompts = [f"Request number {i} says" for i in range(64)]
    expected = [solo_text(server, tok.encode(p), 16) for p in prompts]
    results: dict[int, str] = {}
    errors = []

    def run(i):
        try:
            c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
            s = c.completions.create(
                model=MODEL,
                prompt=prompts[i],
                max_tokens=16,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            results[i] = "".join(ch.choices[0].text for ch in s)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert [results[i] for i in range(64)] == expected
    assert server.manager.stats()["inflight_requests"] == 0


# -- what a gateway in front of several replicas reads ------------------------------------------
def test_every_response_carries_its_request_id_and_the_access_log_names_it(server, caplog):
    base = server.base_url
    with caplog.at_level(logging.INFO, logger="roseinfer.access"):
        given = httpx.get(base + "/health", headers={"X-Request-Id": "gw-42.a_b"})
        assert given.headers["x-request-id"] == "gw-42.a_b"  # echoed as sent
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3}
        minted = httpx.post(base + "/v1/completions", json=body)
        assert minted.status_code == 200 and re.fullmatch(r"[0-9a-f]{32}", minted.headers["x-request-id"])
        bad = httpx.post(base + "/v1/completions", json=body, headers={"X-Request-Id": "two words " + "x" * 200})
        assert re.fullmatch(r"[0-9a-f]{32}", bad.headers["x-request-id"])  # not a short printable token: replaced
        refused = httpx.post(base + "/v1/completions", json={**body, "model": "not-served"},
                             headers={"X-Request-Id": "err-1"})
        assert refused.status_code == 404 and refused.headers["x-request-id"] == "err-1"
        with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True},
                          headers={"X-Request-Id": "stream-1"}) as streamed:
            assert streamed.headers["x-request-id"] == "stream-1"
            assert [line for line in streamed.iter_lines() if line][-1] == "data: [DONE]"
    logged = [r.getMessage() for r in caplog.records if r.name == "roseinfer.access"]
    for rid, status in (("gw-42.a_b", 200), ("err-1", 404), ("stream-1", 200),
                        (minted.headers["x-request-id"], 200)):
        assert any(line.endswith(f"request_id={rid}") and f" {status} " in line for line in logged), (rid, logged)


def test_models_root_is_where_the_weights_are(server):
    model = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    assert model["id"] == MODEL and model["max_model_len"] == server.manager.engine.max_model_len
    assert (Path(model["root"]) / "config.json").is_file()  # a path a gateway can show; no prose
    assert model["weights"] == f"HF checkpoint {model['root']}"


def test_prefix_cache_hits_and_queries_are_prometheus_counters(server):
    before = {k: metric(server, f"roseinfer:prefix_cache_{k}_total") for k in ("queries", "hits")}
    prompt = "A shared system prompt long enough to fill whole blocks of the KV cache, twice over. " * 3
    for _ in range(2):
        httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    stats = server.manager.stats()
    after = {k: metric(server, f"roseinfer:prefix_cache_{k}_total") for k in ("queries", "hits")}
    assert after["queries"] >= before["queries"] + 2 * len(server.manager.engine.tokenizer.encode(prompt)) - 2
    assert after["hits"] > before["hits"]  # the second request found the first one's blocks
    assert (after["queries"], after["hits"]) == (stats["prefix_cache_queries"], stats["prefix_cache_hits"])


# -- the other endpoints ----------------------------------------------------------------------
def test_health_models_and_generate(server):
    base = server.base_url
    assert httpx.get(base + "/health").json() == {"status": "ok"}
    models = httpx.get(base + "/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    # root: where the weights are, as a path a gateway can show (their description has its own field)
    assert (Path(models["data"][0]["root"]) / "config.json").is_file()
    assert models["data"][0]["weights"] == f"HF checkpoint {models['data'][0]['root']}"
    assert models["data"][0]["roseinfer"]["random_weights"] is False
    body = {"prompt": "Hello", "max_new_tokens": 8, "stop_on_eos": False}
    out = httpx.post(base + "/generate", json=body).json()
    ids = server.manager.engine.tokenizer.encode("Hello")
    assert out["text"] == solo_text(server, ids, 8) and out["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 8
    with httpx.stream("POST", base + "/generate", json={**body, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/plain")
        assert "".join(r.iter_text()) == out["text"]
    sampled = httpx.post(
        base + "/generate", json={**body, "do_sample": True, "temperature": 1.0, "seed": 3}
    ).json()
    assert sampled["usage"]["completion_tokens"] == 8


def test_sse_framing(server):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        json.loads(event[len("data: ") :])


BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "bogus_field": 1}, 400, "bogus_field"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "echo": True}, 400, "echo"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 300}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": [99999999]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "prompt"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages.0.role",
    ),
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        },
        400,
        "messages.0.content",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        400,
        "tools",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5000},
        400,
        "max_tokens",
    ),
    ("/generate", {"prompt": "x", "max_new_tokens": -3}, 400, "max_new_tokens"),
    ("/generate", {"prompt": ""}, 400, "prompt"),
]


@pytest.mark.parametrize("path, body, status, param", BAD_REQUESTS)
def test_bad_inputs_get_a_clear_4xx(server, path, body, status, param):
    kwargs = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    r = httpx.post(server.base_url + path, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param, error


def test_context_overflow_message_has_the_numbers(server):
    r = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": MODEL, "prompt": "one two three", "max_tokens": 300},
    )
    message = r.json()["error"]["message"]
    assert "3 tokens" in message and "300" in message and "256" in message


def test_other_http_errors_keep_the_error_shape(server):
    r = httpx.get(server.base_url + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    r = httpx.get(server.base_url + "/no/such/route")
    assert r.status_code == 404 and "error" in r.json()


def test_bad_inputs_do_not_disturb_other_requests(server, client):
    """A good stream runs while a flood of bad requests arrives; it completes unchanged."""
    prompt = "A steady request"
    ids = server.manager.engine.tokenizer.encode(prompt)
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    for path, body, status, _ in BAD_REQUESTS * 2:
        kwargs = (
            {"content": body, "headers": {"content-type": "application/json"}}
            if isinstance(body, bytes)
            else {"json": body}
        )
        assert httpx.post(server.base_url + path, **kwargs).status_code == status
    assert "".join(c.choices[0].text for c in stream) == solo_text(server, ids, 40)
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_body_size_limit(hf_tiny_dir):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64)
    with make_server(engine, max_request_bytes=2000) as live:
        r = httpx.post(live.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x" * 5000})
        assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

        def chunked():
            yield json.dumps({"model": MODEL, "prompt": "y" * 5000}).encode()

        r = httpx.post(
            live.base_url + "/v1/completions", content=chunked(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        ok = httpx.post(
            live.base_url + "/v1/completions", json={"model": MODEL, "prompt": "small", "max_tokens": 2}
        )
        assert ok.status_code == 200


# -- disconnects, overload, keys, failures ----------------------------------------------------
def test_disconnect_mid_stream_frees_everything(server):
    manager = server.manager
    body = {"model": MODEL, "prompt": "A long story", "max_tokens": 200, "stream": True, "ignore_eos": True}
    for path, payload in [
        ("/v1/completions", body),
        (
            "/v1/chat/completions",
            {
                **{k: v for k, v in body.items() if k != "prompt"},
                "messages": [{"role": "user", "content": "go"}],
            },
        ),
        (
            "/generate",
            {"prompt": "A long story", "max_new_tokens": 200, "stop_on_eos": False, "stream": True},
        ),
    ]:
        for _ in range(3):
            with httpx.stream("POST", server.base_url + path, json=payload) as r:
                lines = r.iter_lines() if path != "/generate" else r.iter_text()
                next(lines)
                next(lines)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        manager.stats()["inflight_requests"] or manager.stats()["used_blocks"]
    ):
        time.sleep(0.05)
    assert manager.stats()["inflight_requests"] == 0
    assert metric(server, "roseinfer:num_requests_running") == 0
    assert metric(server, "roseinfer:kv_cache_usage_perc") == 0


def test_disconnect_during_a_non_streaming_request_aborts_it(hf_tiny_dir):
    # Slowed to 20 ms a step, so that 250 tokens (5 s) surely outlast the client's 0.2 s timeout.
    engine = slowed_down(InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=128), 0.02)
    with make_server(engine) as live:
        manager = live.manager
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                live.base_url + "/v1/completions",
                json={"model": MODEL, "prompt": "x", "max_tokens": 250, "ignore_eos": True},
                timeout=0.2,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and manager.stats()["inflight_requests"]:
            time.sleep(0.05)
        assert manager.stats()["inflight_requests"] == 0


def test_overload_gets_429(hf_tiny_dir):
    engine = slowed_down(InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=128), 0.02)
    with make_server(engine, max_inflight_requests=2) as live:
        body = {"model": MODEL, "prompt": "busy", "max_tokens": 250, "stream": True, "ignore_eos": True}
        with (
            httpx.stream("POST", live.base_url + "/v1/completions", json=body) as a,
            httpx.stream("POST", live.base_url + "/v1/completions", json=body) as b,
        ):
            a_lines, b_lines = a.iter_lines(), b.iter_lines()  # keep them: a dropped iterator hangs up
            next(a_lines)
            next(b_lines)
            assert live.manager.stats()["inflight_requests"] == 2
            r = httpx.post(live.base_url + "/v1/completions", json={**body, "stream": False})
            assert r.status_code == 429
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert r.headers["retry-after"] == "1"
        # Closing the two streams aborted them: there is room again.
        assert (
            httpx.post(
                live.base_url + "/v1/completions", json={**body, "stream": False, "max_tokens": 2}
            ).status_code
            == 200
        )


def test_api_key(hf_tiny_dir):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64)
    with make_server(engine, api_key="s3cret") as live:
        base = live.base_url
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        for headers in [
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "s3cret"},
            {"Authorization": "Basic s3cret"},
        ]:
            r = httpx.post(base + "/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(base + "/v1/models").status_code == 401
        assert httpx.post(base + "/generate", json={"prompt": "x"}).status_code == 401
        assert httpx.get(base + "/health").status_code == 200
        assert httpx.get(base + "/metrics").status_code == 200
        good = openai.OpenAI(base_url=base + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="nope", max_retries=0).models.list()


def test_worker_failure_ends_streams_and_turns_health_503(hf_tiny_dir):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64)
    with make_server(engine) as live:
        base = live.base_url
        body = {"model": MODEL, "prompt": "doomed", "max_tokens": 250, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", base + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            real_execute = engine.runner.execute

            def broken(batch):
                raise RuntimeError("simulated CUDA error")

            engine.runner.execute = broken
            rest = [line for line in lines if line]
            engine.runner.execute = real_execute
        assert rest[-1] == "data: [DONE]"
        assert "simulated CUDA error" in json.loads(rest[-2][len("data: ") :])["error"]["message"]
        assert httpx.get(base + "/health").status_code == 503
        r = httpx.post(base + "/v1/completions", json={**body, "stream": False})
        assert r.status_code == 503 and "error" in r.json()
        # The gauges say the engine is down, not what its last step looked like.
        assert metric(live, "roseinfer:engine_healthy") == 0
        assert metric(live, "roseinfer:num_requests_running") == 0
        assert metric(live, "roseinfer:num_requests_waiting") == 0
