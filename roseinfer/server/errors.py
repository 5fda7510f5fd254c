"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the right status.

400 for a bad body or field, 401 for a missing or wrong API key, 404 for an
unknown model or route, 413 for a body over the limit, 429 when too many
requests are in flight, 503 when the engine cannot serve, 500 for a bug.
`add_error_handlers(app)` turns every exception a request can raise into one.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from roseinfer.errors import InvalidRequestError
from roseinfer.server.manager import DrainingError, EngineDeadError, OverloadedError
from roseinfer.server.protocol import error_body

logger = logging.getLogger("roseinfer.server")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        type_ = ERROR_TYPES.get(self.status, "server_error")
        body = error_body(self.message, type_, self.param, self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def submit_error(exc: Exception) -> APIError:
    """The HTTP error for what `manager.submit` raised (anything else is re-raised: a bug)."""
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), exc.param)
    if isinstance(exc, OverloadedError):
        # A slot frees up as soon as one request ends: a second is a fair first wait.
        return APIError(429, f"the server is overloaded: {exc}; retry later", headers={"Retry-After": "1"})
    if isinstance(exc, DrainingError):  # a gateway retries it on another replica at once
        return APIError(503, str(exc), headers={"Retry-After": "1"})
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc))
    raise exc


def validation_error(exc: RequestValidationError) -> APIError:
    """A body pydantic refused: 400 naming the field (or saying the JSON is malformed)."""
    errors = exc.errors()
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', 'could not parse')}")
    # A value that matches no member of a union fails once per member, each
    # loc ending in the member's name: the field is their common prefix.
    locs = [[str(x) for x in e.get("loc", ()) if x != "body"] for e in errors]
    locs = [loc for loc in locs if loc[:1] == locs[0][:1]]
    prefix = locs[0]
    for loc in locs[1:]:
        n = 0
        while n < min(len(prefix), len(loc)) and prefix[n] == loc[n]:
            n += 1
        prefix = prefix[:n]
    param = ".".join(prefix) or None
    reasons = "; ".join(dict.fromkeys(str(e.get("msg")) for e in errors[: len(locs)]))
    return APIError(400, f"{param}: {reasons}" if param else reasons, param)


async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _bad_field(_request: Request, exc: InvalidRequestError) -> JSONResponse:
    return APIError(400, str(exc), exc.param).response()


async def _bad_body(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return validation_error(exc).response()


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return APIError(exc.status_code, str(exc.detail)).response()


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error", exc_info=exc)
    return JSONResponse(error_body(f"internal error: {exc!r}", "server_error"), status_code=500)


def add_error_handlers(app: FastAPI) -> None:
    handlers: dict[type[Exception], Any] = {
        APIError: _api_error,
        InvalidRequestError: _bad_field,
        RequestValidationError: _bad_body,
        StarletteHTTPException: _http_error,
        Exception: _unexpected,
    }
    for exc_class, handler in handlers.items():
        app.add_exception_handler(exc_class, handler)


class BodySizeLimit:
    """ASGI middleware: refuse bodies over the limit with 413, by Content-Length or while reading."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = APIError(
                413, f"request body of {int(declared)} bytes is over the {self.max_bytes}-byte limit"
            ).response()
            return await response(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise StarletteHTTPException(413, f"request body is over the {self.max_bytes}-byte limit")
            return message

        await self.app(scope, limited_receive, send)
