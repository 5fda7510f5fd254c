"""The bodies the load generators people use send, byte for byte, and a first chunk that means a token.

`vllm bench serve --backend openai` (completions) sends `repetition_penalty:
1.0` and `logprobs: null`; it and `--backend openai-chat` (the text as a list
of content parts) send `stream_options.include_usage`, `ignore_eos` when
asked, and since vLLM 0.32 no temperature. Both start the first-token clock
at the first streamed chunk that has choices.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from live_server import MODEL, make_server, slowed_down
from roseinfer import InferenceEngine, SamplingParams
from roseinfer.bench.serving import vllm_body

# roseinfer.bench.serving.vllm_body is the copy of vLLM 0.32's request functions that
# benchmarks/compare_served.py posts when vLLM's own client is not installed.
VLLM_COMPLETIONS_BODY = vllm_body("openai", MODEL, "The quick brown fox", 12)
VLLM_CHAT_BODY = vllm_body("openai-chat", MODEL, "The quick brown fox", 12)


def test_the_bodies_are_vllm_032s():
    assert VLLM_COMPLETIONS_BODY == {
        "model": MODEL,
        "prompt": "The quick brown fox",
        "repetition_penalty": 1.0,
        "max_tokens": 12,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    assert VLLM_CHAT_BODY == {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "The quick brown fox"}]}],
        "max_completion_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def sse_events(response: httpx.Response) -> list[dict]:
    lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


@pytest.fixture(scope="module")
def server(hf_tiny_dir):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=128)
    with make_server(engine) as live:
        yield live


def test_vllm_bench_completions_body(server):
    with httpx.stream("POST", server.base_url + "/v1/completions", json=VLLM_COMPLETIONS_BODY) as r:
        assert r.status_code == 200
        events = sse_events(r)
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    engine = server.manager.engine
    prompt = engine.tokenizer.encode(VLLM_COMPLETIONS_BODY["prompt"])
    # repetition_penalty 1.0 is no penalty; the default temperature 1.0 samples: compare lengths.
    assert events[-1]["usage"]["completion_tokens"] == 12
    assert events[-1]["usage"]["prompt_tokens"] == len(prompt)
    greedy = httpx.post(
        server.base_url + "/v1/completions", json={**VLLM_COMPLETIONS_BODY, "stream": False, "temperature": 0}
    )
    assert greedy.status_code == 400  # stream_options without stream, as OpenAI says
    greedy = {k: v for k, v in VLLM_COMPLETIONS_BODY.items() if k != "stream_options"}
    out = httpx.post(server.base_url + "/v1/completions", json={**greedy, "stream": False, "temperature": 0})
    expected = engine.generate([prompt], SamplingParams(max_new_tokens=12, stop_on_eos=False))[0].text
    assert out.json()["choices"][0]["text"] == expected and text


def test_vllm_bench_chat_body(server):
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=VLLM_CHAT_BODY) as r:
        assert r.status_code == 200
        events = sse_events(r)
    first = events[0]["choices"][0]["delta"]
    assert first["role"] == "assistant" and first["content"], "the first chunk carries the first token"
    assert events[-1]["usage"]["completion_tokens"] == 12
    # No temperature in vLLM's body samples at 1.0; greedy, the stream must say what a plain answer says.
    greedy = {**VLLM_CHAT_BODY, "temperature": 0.0}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=greedy) as r:
        events = sse_events(r)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    plain = {k: v for k, v in greedy.items() if k not in ("stream", "stream_options")}
    out = httpx.post(server.base_url + "/v1/chat/completions", json=plain).json()
    assert text == out["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "field, value",
    [("repetition_penalty", 1.2), ("min_p", 0.1), ("min_tokens", 3), ("stop_token_ids", [13]), ("n", 2)],
)
def test_a_feature_roseinfer_lacks_is_refused_at_a_non_neutral_value(server, field, value):
    body = {**VLLM_COMPLETIONS_BODY, "stream": False, field: value}
    del body["stream_options"]
    r = httpx.post(server.base_url + "/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_unknown_fields_are_refused_by_name(server):
    r = httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x", "frobnicate": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"


def test_no_chat_chunk_precedes_the_first_token(hf_tiny_dir):
    """With every step slowed to 0.3 s, the first chunk cannot arrive before the first step ends."""
    engine = slowed_down(InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64), 0.3)
    with make_server(engine) as live:
        body = {**VLLM_CHAT_BODY, "max_completion_tokens": 2}
        start = time.perf_counter()
        with httpx.stream("POST", live.base_url + "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            first_line = next(line for line in lines if line.startswith("data: "))
            first_at = time.perf_counter() - start
            for _ in lines:
                pass
    assert first_at >= 0.3, f"the first chunk came {first_at * 1000:.0f} ms in, before any token existed"
    assert json.loads(first_line[len("data: ") :])["choices"][0]["delta"]["content"]
