"""POST /v1/completions: OpenAI's text completions, one choice per prompt, as JSON or server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from roseinfer.server.dependencies import ManagerDep, SettingsDep, abort_all, check_model, submit_all
from roseinfer.server.protocol import CompletionRequest, envelope, usage
from roseinfer.server.sse import merge, reply, sse
from roseinfer.server.streams import RequestStream, StreamEnd

router = APIRouter()


@router.post("/v1/completions")
async def completions(
    req: CompletionRequest, request: Request, manager: ManagerDep, settings: SettingsDep
) -> Response:
    check_model(req, settings)
    params = req.sampling_params(req.max_tokens or 16)
    streams = submit_all(manager, req.prompts(), params)
    base = envelope("cmpl", "text_completion", req.model)

    def to_json(results: list[tuple[str, StreamEnd]]) -> dict[str, Any]:
        choices = [
            {"index": i, "text": text, "logprobs": None, "finish_reason": end.finish_reason}
            for i, (text, end) in enumerate(results)
        ]
        return {**base, "choices": choices, "usage": total_usage(e for _, e in results)}

    events = completion_events(base, streams, req.include_usage) if req.stream else None
    return await reply(request, streams, abort_all(manager, streams), events, to_json)


def total_usage(ends: Iterable[StreamEnd]) -> dict[str, int]:
    ends = list(ends)
    return usage(sum(e.prompt_tokens for e in ends), sum(e.completion_tokens for e in ends))


async def completion_events(
    base: dict[str, Any], streams: list[RequestStream], include_usage: bool
) -> AsyncIterator[str]:
    """One chunk per text piece of any choice, one with its finish reason; usage last if asked for."""
    extra = {"usage": None} if include_usage else {}
    ends: list[StreamEnd] = []
    async with aclosing(merge(streams)) as merged:
        async for i, item in merged:
            if isinstance(item, StreamEnd):
                ends.append(item)
                choice = {"index": i, "text": "", "logprobs": None, "finish_reason": item.finish_reason}
            else:
                choice = {"index": i, "text": item, "logprobs": None, "finish_reason": None}
            yield sse({**base, "choices": [choice], **extra})
    if include_usage:
        yield sse({**base, "choices": [], "usage": total_usage(ends)})
