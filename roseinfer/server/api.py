"""The HTTP API: OpenAI-compatible completions and chat, /generate, health, models, metrics.

    app = create_app(manager, served_model_name="gpt2")

Every error has OpenAI's shape, `{"error": {"message", "type", "param",
"code"}}`, with the right status: 400 for a bad body or field, 401 for a
missing or wrong API key, 404 for an unknown model, 413 for a body over the
limit, 429 when too many requests are in flight, 503 when the engine cannot
serve. A client that disconnects has its requests aborted and their KV blocks
freed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from roseinfer.errors import InvalidRequestError
from roseinfer.sampling import SamplingParams
from roseinfer.server.manager import EngineDeadError, OverloadedError, StreamingFrontend
from roseinfer.server.metrics import ServerMetrics
from roseinfer.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    SamplingFields,
    error_body,
    usage,
)
from roseinfer.server.streams import RequestStream, StreamClosedError, StreamEnd
from roseinfer.tokenizer import ChatFormatter

logger = logging.getLogger("roseinfer.server")

DEFAULT_MAX_REQUEST_BYTES = 1 << 20
_ERROR_TYPES = {
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
        type_ = _ERROR_TYPES.get(self.status, "server_error")
        body = error_body(self.message, type_, self.param, self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


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


# -- plumbing ------------------------------------------------------------------------------
class BodySizeLimit:
    """Refuse bodies over the limit with 413, by Content-Length or while reading."""

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


def _submit_error(exc: Exception) -> APIError:
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), exc.param)
    if isinstance(exc, OverloadedError):
        # A slot frees up as soon as one request ends: a second is a fair first wait.
        return APIError(429, f"the server is overloaded: {exc}; retry later", headers={"Retry-After": "1"})
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc))
    raise exc


async def _until_disconnect(request: Request, work: Awaitable[Any], on_disconnect) -> Any:
    """Run `work`; if the client goes away first, cancel it and call on_disconnect()."""
    work_task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        done, _ = await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work_task in done:
            return work_task.result()
        work_task.cancel()
        on_disconnect()
        raise APIError(499, "client disconnected")
    finally:
        watcher.cancel()


async def _merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, str | StreamEnd]]:
    """(choice index, text piece or StreamEnd) from every stream, as they come.

    Callers iterate it inside `aclosing`, so that the pump tasks of a request
    whose client went away are cancelled at once, not when the GC gets to them.
    """
    if len(streams) == 1:
        async for piece in streams[0]:
            yield 0, piece
        yield 0, streams[0].end
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for piece in stream:
                await queue.put((i, piece))
            await queue.put((i, stream.end))
        except StreamClosedError as exc:
            await queue.put((i, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for _ in range(len(streams)):
            while True:
                i, item = await queue.get()
                if isinstance(item, StreamClosedError):
                    raise item
                yield i, item
                if isinstance(item, StreamEnd):
                    break
    finally:
        for t in tasks:
            t.cancel()


def _sse(payload: dict[str, Any] | str) -> str:
    data = (
        payload
        if isinstance(payload, str)
        else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    )
    return f"data: {data}\n\n"


# -- the app -------------------------------------------------------------------------------
def create_app(
    manager: StreamingFrontend,
    settings: ServerSettings | None = None,
    metrics: ServerMetrics | None = None,
) -> FastAPI:
    settings = settings or ServerSettings()
    chat = settings.chat or ChatFormatter()
    engine = manager.engine
    if metrics is None:
        metrics = ServerMetrics(manager.stats)
    metrics.bind(manager.stats)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        manager.close()

    app = FastAPI(title="roseinfer", version="0.1.0", lifespan=lifespan)
    app.state.manager, app.state.settings, app.state.metrics = manager, settings, metrics
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)

    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(InvalidRequestError)
    async def _bad_field(_request: Request, exc: InvalidRequestError) -> JSONResponse:
        return APIError(400, str(exc), exc.param).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0]
        if first.get("type") == "json_invalid":
            message = f"malformed JSON body: {first.get('ctx', {}).get('error', 'could not parse')}"
            return APIError(400, message).response()
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
        return APIError(400, f"{param}: {reasons}" if param else reasons, param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error", exc_info=exc)
        return JSONResponse(error_body(f"internal error: {exc!r}", "server_error"), status_code=500)

    def check_api_key(request: Request) -> None:
        if settings.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        expected = settings.api_key.encode()
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), expected):
            raise APIError(
                401, "a valid API key is required: send 'Authorization: Bearer <key>'", code="invalid_api_key"
            )

    def check_model(req: SamplingFields) -> None:
        if req.model not in settings.model_names:
            raise APIError(
                404,
                f"the model '{req.model}' does not exist; this server serves "
                + " or ".join(f"'{name}'" for name in settings.model_names),
                "model",
                "model_not_found",
            )
        req.check_supported()

    def submit_all(requests: list[tuple[str | list[int], SamplingParams]]) -> list[RequestStream]:
        loop = asyncio.get_running_loop()
        streams: list[RequestStream] = []
        try:
            for prompt, params in requests:
                kwargs = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
                streams.append(manager.submit(**kwargs, params=params, loop=loop))
        except Exception as exc:
            for s in streams:
                manager.abort(s.request_id)
            raise _submit_error(exc) from exc
        return streams

    async def collect(streams: list[RequestStream]) -> list[tuple[str, StreamEnd]]:
        texts = [[] for _ in streams]
        ends: list[StreamEnd | None] = [None] * len(streams)
        try:
            async with aclosing(_merge(streams)) as merged:
                async for i, item in merged:
                    if isinstance(item, StreamEnd):
                        ends[i] = item
                    else:
                        texts[i].append(item)
        except StreamClosedError as exc:
            raise APIError(503, f"generation failed: {exc}") from exc
        return [("".join(t), e) for t, e in zip(texts, ends)]

    def abort_all(streams: list[RequestStream]):
        return lambda: [manager.abort(s.request_id) for s in streams]

    open_routes = APIRouter()
    keyed_routes = APIRouter(dependencies=[Depends(check_api_key)])

    @open_routes.get("/health")
    async def health() -> Response:
        if not manager.healthy:
            reason = manager.error or "the server is shutting down"
            return APIError(503, f"unhealthy: {reason!r}").response()
        return JSONResponse({"status": "ok"})

    @open_routes.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @keyed_routes.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "roseinfer",
                    "root": engine.weights.description,
                    "max_model_len": engine.max_model_len,
                    "roseinfer": engine.describe(),
                }
                for name in settings.model_names
            ],
        }

    async def reply(
        request: Request, streams: list[RequestStream], stream: bool, events, to_json
    ) -> Response:
        """SSE from `events(abort)` when streaming, else JSON from `to_json(results)`."""
        abort = abort_all(streams)
        if stream:
            return StreamingResponse(events(abort), media_type="text/event-stream")
        results = await _until_disconnect(request, collect(streams), abort)
        return JSONResponse(to_json(results))

    @keyed_routes.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        check_model(req)
        params = req.sampling_params(req.max_tokens or 16)
        streams = submit_all([(p, params) for p in req.prompts()])
        base = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req.model,
        }

        def to_json(results):
            choices = [
                {"index": i, "text": text, "logprobs": None, "finish_reason": end.finish_reason}
                for i, (text, end) in enumerate(results)
            ]
            return {**base, "choices": choices, "usage": _total_usage(e for _, e in results)}

        return await reply(
            request,
            streams,
            req.stream,
            lambda abort: _sse_stream(_completion_events(base, streams, req.include_usage), abort),
            to_json,
        )

    @keyed_routes.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        check_model(req)
        messages = [{"role": m.role, "content": m.text(), "name": m.name} for m in req.messages]
        try:
            prompt_ids = engine.tokenizer.encode(chat.render(messages))
        except Exception as exc:
            raise APIError(400, f"the chat template failed on these messages: {exc}", "messages") from exc
        max_tokens = req.requested_max_tokens()
        if max_tokens is None:  # as much as the context leaves
            max_tokens = engine.max_model_len - len(prompt_ids)
            if max_tokens < 1:
                raise APIError(
                    400,
                    f"the conversation has {len(prompt_ids)} tokens, which fills the model's "
                    f"context of {engine.max_model_len} tokens",
                    "messages",
                )
        streams = submit_all([(prompt_ids, req.sampling_params(max_tokens))])
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": req.model,
        }

        def to_json(results):
            [(text, end)] = results
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": end.finish_reason,
            }
            return {
                **base,
                "object": "chat.completion",
                "choices": [choice],
                "usage": usage(end.prompt_tokens, end.completion_tokens),
            }

        return await reply(
            request,
            streams,
            req.stream,
            lambda abort: _sse_stream(_chat_events(base, streams, req.include_usage), abort),
            to_json,
        )

    @keyed_routes.post("/generate")
    async def generate(req: GenerateRequest, request: Request) -> Response:
        streams = submit_all([(req.prompt, req.sampling_params())])
        if req.stream:
            return CutOnFailureResponse(
                _until_client_leaves(_text_pieces(streams[0]), abort_all(streams)),
                media_type="text/plain; charset=utf-8",
            )
        [(text, end)] = await _until_disconnect(request, collect(streams), abort_all(streams))
        return JSONResponse(
            {
                "text": text,
                "finish_reason": end.finish_reason,
                "usage": usage(end.prompt_tokens, end.completion_tokens),
                "model": settings.served_model_name,
            }
        )

    app.include_router(open_routes)
    app.include_router(keyed_routes)
    return app


def _total_usage(ends) -> dict[str, int]:
    ends = list(ends)
    return usage(sum(e.prompt_tokens for e in ends), sum(e.completion_tokens for e in ends))


async def _until_client_leaves(events: AsyncIterator[str], abort, on_error=None) -> AsyncIterator[str]:
    """Pass `events` through; a failed generation becomes `on_error(exc)` and ends the stream
    (without `on_error`, the StreamClosedError goes on to the response); a client that goes
    away before the end has its requests aborted."""
    finished = False
    try:
        async with aclosing(events) as inner:
            async for event in inner:
                yield event
        finished = True
    except StreamClosedError as exc:
        finished = True
        if on_error is None:
            raise
        yield on_error(exc)
    finally:
        if not finished:
            abort()


class CutOnFailureResponse(StreamingResponse):
    """/generate's plain-text stream, whose failure is visible on the wire.

    Plain text has no error event, so when generation fails (the worker died,
    the server is shutting down) the stream sends one last line,
    `\n[roseinfer error] generation failed: ...`, and then returns without the
    final empty chunk: the server closes the connection mid-body, and every
    HTTP client reports a truncated transfer instead of a finished answer.
    """

    async def stream_response(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send(
                    {"type": "http.response.body", "body": chunk.encode(self.charset), "more_body": True}
                )
        except StreamClosedError as exc:
            line = f"\n[roseinfer error] generation failed: {exc}\n".encode(self.charset, "backslashreplace")
            await send({"type": "http.response.body", "body": line, "more_body": True})
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _error_event(exc: Exception) -> str:
    return _sse(error_body(f"generation failed: {exc}", "service_unavailable_error", code=503))


async def _sse_stream(events: AsyncIterator[str], abort) -> AsyncIterator[str]:
    """OpenAI's SSE framing: the events, an error event if generation failed, then [DONE]."""
    async for event in _until_client_leaves(events, abort, _error_event):
        yield event
    yield _sse("[DONE]")


async def _completion_events(base, streams, include_usage) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}
    ends: list[StreamEnd] = []
    async with aclosing(_merge(streams)) as merged:
        async for i, item in merged:
            if isinstance(item, StreamEnd):
                ends.append(item)
                choice = {"index": i, "text": "", "logprobs": None, "finish_reason": item.finish_reason}
            else:
                choice = {"index": i, "text": item, "logprobs": None, "finish_reason": None}
            yield _sse({**base, "choices": [choice], **extra})
    if include_usage:
        yield _sse({**base, "choices": [], "usage": _total_usage(ends)})


async def _chat_events(base, streams, include_usage) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, str], finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return _sse({**base, "choices": [choice], **extra})

    # The role goes out with the first token, not before it: a client that starts its
    # first-token clock at the first chunk (vLLM's benchmark does) then measures a real TTFT.
    role: dict[str, str] = {"role": "assistant"}
    async with aclosing(_merge(streams)) as merged:
        async for _, item in merged:
            if role and isinstance(item, StreamEnd):  # ended before any text
                yield chunk({**role, "content": ""})
            if isinstance(item, StreamEnd):
                yield chunk({}, item.finish_reason)
                if include_usage:
                    yield _sse(
                        {**base, "choices": [], "usage": usage(item.prompt_tokens, item.completion_tokens)}
                    )
            else:
                yield chunk({**role, "content": item})
            role = {}


async def _text_pieces(stream: RequestStream) -> AsyncIterator[str]:
    async for piece in stream:
        yield piece
