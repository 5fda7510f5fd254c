"""From request streams to a response: server-sent events, one JSON body, or /generate's plain text.

A client that goes away, before its JSON body or in the middle of a stream,
has its requests aborted (`abort()`), so their KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from roseinfer.server.errors import APIError
from roseinfer.server.protocol import error_body
from roseinfer.server.streams import RequestStream, StreamClosedError, StreamEnd

Abort = Callable[[], object]


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: `data: <compact JSON or the string>`, then a blank line."""
    data = (
        payload
        if isinstance(payload, str)
        else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    )
    return f"data: {data}\n\n"


def error_event(exc: Exception) -> str:
    return sse(error_body(f"generation failed: {exc}", "service_unavailable_error", code=503))


async def merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, str | StreamEnd]]:
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


async def collect(streams: list[RequestStream]) -> list[tuple[str, StreamEnd]]:
    """Each stream's whole text and its end; 503 if generation failed."""
    texts: list[list[str]] = [[] for _ in streams]
    ends: list[StreamEnd | None] = [None] * len(streams)
    try:
        async with aclosing(merge(streams)) as merged:
            async for i, item in merged:
                if isinstance(item, StreamEnd):
                    ends[i] = item
                else:
                    texts[i].append(item)
    except StreamClosedError as exc:
        raise APIError(503, f"generation failed: {exc}") from exc
    return [("".join(t), e) for t, e in zip(texts, ends)]


async def until_disconnect(request: Request, work: Awaitable[Any], on_disconnect: Abort) -> Any:
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


async def until_client_leaves(
    events: AsyncIterator[str], abort: Abort, on_error: Callable[[Exception], str] | None = None
) -> AsyncIterator[str]:
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


async def sse_stream(events: AsyncIterator[str], abort: Abort) -> AsyncIterator[str]:
    """OpenAI's SSE framing: the events, an error event if generation failed, then [DONE]."""
    async for event in until_client_leaves(events, abort, error_event):
        yield event
    yield sse("[DONE]")


async def reply(
    request: Request,
    streams: list[RequestStream],
    abort: Abort,
    events: AsyncIterator[str] | None,
    to_json: Callable[[list[tuple[str, StreamEnd]]], dict[str, Any]],
) -> Response:
    """SSE from `events` when the client asked for a stream (events is not None), else one JSON body."""
    if events is not None:
        return StreamingResponse(sse_stream(events, abort), media_type="text/event-stream")
    results = await until_disconnect(request, collect(streams), abort)
    return JSONResponse(to_json(results))


async def text_pieces(stream: RequestStream) -> AsyncIterator[str]:
    async for piece in stream:
        yield piece


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
