"""What the routes share: the server's settings and state (on `app.state`), the API key check,
the model check, and submitting a request's prompts to the manager."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from roseinfer.sampling import SamplingParams
from roseinfer.server.errors import APIError, submit_error
from roseinfer.server.manager import Manager
from roseinfer.server.metrics import ServerMetrics
from roseinfer.server.protocol import SamplingFields
from roseinfer.server.streams import RequestStream
from roseinfer.tokenizer import ChatFormatter

DEFAULT_MAX_REQUEST_BYTES = 1 << 20


@dataclass
class ServerSettings:
    served_model_name: str = "gpt2"
    # More names a client may pass as 'model', as vLLM's --served-model-name takes several.
    model_aliases: tuple[str, ...] = ()
    api_key: str | None = None
    chat: ChatFormatter | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.served_model_name, *self.model_aliases)


def get_manager(request: Request) -> Manager:
    return request.app.state.manager


def get_settings(request: Request) -> ServerSettings:
    return request.app.state.settings


def get_metrics(request: Request) -> ServerMetrics:
    return request.app.state.metrics


ManagerDep = Annotated[Manager, Depends(get_manager)]
SettingsDep = Annotated[ServerSettings, Depends(get_settings)]
MetricsDep = Annotated[ServerMetrics, Depends(get_metrics)]


def check_api_key(request: Request, settings: SettingsDep) -> None:
    """401 unless the request carries `Authorization: Bearer <the key>` (compared in constant time)."""
    if settings.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    expected = settings.api_key.encode()
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), expected):
        raise APIError(
            401, "a valid API key is required: send 'Authorization: Bearer <key>'", code="invalid_api_key"
        )


def check_model(req: SamplingFields, settings: ServerSettings) -> None:
    """404 for a model this server does not serve; 400 for an OpenAI field it does not implement."""
    if req.model not in settings.model_names:
        raise APIError(
            404,
            f"the model '{req.model}' does not exist; this server serves "
            + " or ".join(f"'{name}'" for name in settings.model_names),
            "model",
            "model_not_found",
        )
    req.check_supported()


def submit_all(
    manager: Manager, prompts: list[str | list[int]], params: SamplingParams
) -> list[RequestStream]:
    """One stream per prompt (text or token ids), read from this event loop; all or none."""
    loop = asyncio.get_running_loop()
    streams: list[RequestStream] = []
    try:
        for prompt in prompts:
            kwargs = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
            streams.append(manager.submit(**kwargs, params=params, loop=loop))
    except Exception as exc:
        for s in streams:
            manager.abort(s.request_id)
        raise submit_error(exc) from exc
    return streams


def abort_all(manager: Manager, streams: list[RequestStream]) -> Callable[[], object]:
    """A callback that aborts every one of `streams` (called when the client goes away)."""
    return lambda: [manager.abort(s.request_id) for s in streams]
