"""The HTTP API: OpenAI-compatible completions and chat, /generate, health, models, metrics.

    app = create_app(manager, ServerSettings(served_model_name="gpt2"))

The app holds the manager, the settings and the metrics on `app.state`; the
routes (routes_*.py) reach them through FastAPI dependencies. Every error has
OpenAI's shape (errors.py); streams are server-sent events (sse.py). A client
that disconnects has its requests aborted and their KV blocks freed. Every
response carries an X-Request-Id, logged with it (request_id.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import Depends, FastAPI

from roseinfer.server import routes_chat, routes_completions, routes_misc
from roseinfer.server.dependencies import DEFAULT_MAX_REQUEST_BYTES, ServerSettings, check_api_key
from roseinfer.server.errors import BodySizeLimit, add_error_handlers
from roseinfer.server.manager import Manager
from roseinfer.server.metrics import ServerMetrics
from roseinfer.server.request_id import RequestId
from roseinfer.tokenizer import ChatFormatter

__all__ = ["DEFAULT_DRAIN_TIMEOUT_S", "DEFAULT_MAX_REQUEST_BYTES", "ServerSettings", "create_app"]
# How long a drain waits for the admitted requests before ending what is left (--drain-timeout).
DEFAULT_DRAIN_TIMEOUT_S = 30.0


def create_app(
    manager: Manager, settings: ServerSettings | None = None, metrics: ServerMetrics | None = None,
    begin_drain: Callable[[], None] | None = None,
) -> FastAPI:
    """The app serving `manager`; shutting the app down closes the manager.

    `begin_drain`: what POST /admin/drain starts (the server's process sets its SIGTERM path); by default
    the manager drains in the background for DEFAULT_DRAIN_TIMEOUT_S and the process keeps running."""
    settings = settings or ServerSettings()
    settings = replace(settings, chat=settings.chat or ChatFormatter())
    metrics = metrics or ServerMetrics()
    metrics.bind(manager.stats)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        manager.close()

    app = FastAPI(title="roseinfer", version="0.1.0", lifespan=lifespan)
    app.state.manager, app.state.settings, app.state.metrics = manager, settings, metrics
    app.state.begin_drain = begin_drain or (
        lambda: threading.Thread(target=manager.drain, args=(DEFAULT_DRAIN_TIMEOUT_S,), daemon=True).start())
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestId)  # added last, so outermost: even a refused body gets its id
    add_error_handlers(app)
    app.include_router(routes_misc.open_router)
    for keyed in (routes_misc.router, routes_completions.router, routes_chat.router):
        app.include_router(keyed, dependencies=[Depends(check_api_key)])
    return app
