"""The thin server: routes that format and forward, and the engine that tokenizes and checks."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import httpx
import pytest

from live_server import MODEL, make_server
from roseinfer.server import (
    app,
    dependencies,
    errors,
    protocol,
    routes_chat,
    routes_completions,
    routes_misc,
    sse,
)
from roseinfer.tokenizer import ChatFormatter

HTTP_MODULES = (app, dependencies, errors, protocol, routes_chat, routes_completions, routes_misc, sse)


def test_chat_without_max_tokens_fills_the_context(engine):
    with make_server(engine) as server:
        _fill_the_context(server)
        _overfill_the_context(server)


def _fill_the_context(server):
    messages = [{"role": "user", "content": "Tell me everything."}]
    body = {"model": MODEL, "messages": messages, "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    engine = server.manager.engine
    prompt_tokens = len(engine.tokenizer.encode(ChatFormatter().render(messages)))
    assert out["usage"]["prompt_tokens"] == prompt_tokens
    assert out["usage"]["total_tokens"] == engine.max_model_len
    assert out["choices"][0]["finish_reason"] == "length"


def _overfill_the_context(server):
    """A conversation that already fills the context: a 400 naming the field the client sent."""
    long = " ".join(["word"] * server.manager.engine.max_model_len)
    body = {"model": MODEL, "messages": [{"role": "user", "content": long}]}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages"
    assert str(server.manager.engine.max_model_len) in error["message"]
    assert server.manager.engine.block_manager.num_used_blocks == 0


def test_the_http_layer_never_reaches_the_tokenizer():
    for module in HTTP_MODULES:
        tree = ast.parse(inspect.getsource(module))
        reached = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "tokenizer"]
        assert not reached, f"{module.__name__} reaches the tokenizer at lines {reached}"


@pytest.mark.parametrize("module", HTTP_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_function_of_the_http_layer_is_short(module):
    tree = ast.parse(Path(module.__file__).read_text())
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    long = {f.name: f.end_lineno - f.lineno + 1 for f in functions if f.end_lineno - f.lineno + 1 >= 80}
    assert not long, f"{module.__name__}: functions of 80 lines or more: {long}"


def test_every_route_is_served_and_keyed_routes_need_the_key(engine):
    with make_server(engine, api_key="k") as live:
        paths = set(live.app.openapi()["paths"])
        assert {
            "/health",
            "/metrics",
            "/v1/models",
            "/v1/completions",
            "/v1/chat/completions",
            "/generate",
        } <= paths
        assert httpx.get(live.base_url + "/health").status_code == 200
        assert httpx.get(live.base_url + "/metrics").status_code == 200
        for method, path in [
            ("GET", "/v1/models"),
            ("POST", "/v1/completions"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/generate"),
        ]:
            r = httpx.request(method, live.base_url + path, json={})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
        r = httpx.get(live.base_url + "/v1/models", headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL
