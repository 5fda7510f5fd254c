"""A property-based fuzz of the whole HTTP API, driven by the app's own OpenAPI schema.

schemathesis draws request bodies that fit the schema (positive) and bodies
that break it (negative: wrong types, missing fields, out-of-range values)
for every route, and sends them to a live server. A second fuzz aims
hypothesis at the sampling fields alone, with the extremes a schema does not
suggest (integers past 64 bits, NaN, infinities, subnormal temperatures, lone
surrogates). Whatever is sent: never a 5xx, every 4xx has OpenAI's error
shape, and the engine stays healthy. The example budgets keep the whole fuzz
under 20 s on a 2-core CPU.
"""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from live_server import MODEL, make_server
from roseinfer import InferenceEngine

EXAMPLES_PER_ROUTE = 25
# One client for the whole fuzz: httpx.get() builds a fresh client, and its TLS context alone costs ~20 ms a call,
# which over the ~900 examples (the schema's explicit examples come on top of the budget) was half the fuzz's time.
HTTP = httpx.Client(timeout=60)


@pytest.fixture(scope="module")
def fuzzed_server(hf_tiny_dir):
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=256)
    with make_server(engine, stream_interval=4) as live:
        yield live


@pytest.fixture
def api_schema(fuzzed_server):
    schema = schemathesis.openapi.from_url(fuzzed_server.base_url + "/openapi.json")
    schema.config.generation.update(
        modes=["positive", "negative"], max_examples=EXAMPLES_PER_ROUTE, deterministic=True, database="none"
    )
    return schema


# POST /admin/drain is meant to take the server out of service (tests/test_drain.py and test_server_cli.py test
# it); fuzzed, its first accepted call would fail every later case's health check.
schema = schemathesis.pytest.from_fixture("api_schema").exclude(path="/admin/drain")


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx_or_hurts_the_engine(case, fuzzed_server):
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        body["model"] = MODEL  # the served name, so the body reaches the sampling fields
    for field in ("max_tokens", "max_completion_tokens", "max_new_tokens"):
        # A valid long request is right but slow: spend the budget on breadth.
        if isinstance(body, dict) and type(body.get(field)) is int and body[field] > 32:
            body[field] = 32
    if isinstance(body, dict) and "messages" in body and "max_tokens" not in body:
        body.setdefault("max_completion_tokens", 32)
    response = case.call(timeout=60)
    assert response.status_code < 500, f"{case.method} {case.path} {body!r} -> {response.text}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
    assert HTTP.get(fuzzed_server.base_url + "/health").status_code == 200


def test_the_engine_served_correctly_after_the_fuzz(fuzzed_server):
    manager = fuzzed_server.manager
    assert manager.healthy and manager.stats()["inflight_requests"] == 0
    body = {
        "model": MODEL,
        "prompt": "after the storm",
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = HTTP.post(fuzzed_server.base_url + "/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


def _assert_clean_answer(server, response: httpx.Response) -> None:
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert server.manager.healthy, server.manager.error


any_int = st.one_of(st.none(), st.integers(), st.integers(min_value=2**62, max_value=2**70))
any_float = st.one_of(st.none(), st.floats(), st.floats(min_value=0, max_value=1e-30), st.integers())
any_text = st.text(st.characters(exclude_categories=()), max_size=8)  # surrogates included


@given(
    route=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/generate"]),
    seed=any_int,
    top_k=any_int,
    temperature=any_float,
    top_p=any_float,
    stop=st.one_of(st.none(), any_text, st.lists(any_text, max_size=6)),
    prompt=any_text,
)
@settings(
    max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True
)
def test_sampling_fields_at_their_extremes(
    fuzzed_server, route, seed, top_k, temperature, top_p, stop, prompt
):
    fields = {"seed": seed, "top_k": top_k, "temperature": temperature, "top_p": top_p, "stop": stop}
    fields = {k: v for k, v in fields.items() if v is not None}
    if route == "/generate":
        body = {"prompt": prompt or "x", "max_new_tokens": 3, "do_sample": True, **fields}
    elif route == "/v1/completions":
        body = {"model": MODEL, "prompt": prompt or "x", "max_tokens": 3, **fields}
    else:
        messages = [{"role": "user", "content": prompt}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 3, **fields}
    # json.dumps writes NaN/Infinity literals and escapes surrogates ("\\ud800"), as a hostile client may.
    content = json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    response = HTTP.post(fuzzed_server.base_url + route, content=content, headers=headers)
    _assert_clean_answer(fuzzed_server, response)
