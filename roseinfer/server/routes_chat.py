"""POST /v1/chat/completions: the conversation rendered to text by the chat template, then one completion.

Rendering is formatting, not tokenization: the text goes to the manager like
any prompt, and the engine tokenizes and checks it. Without max_tokens (or
max_completion_tokens) the reply may fill the rest of the model's context;
a conversation that already fills it is the engine's 400.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from roseinfer.server.dependencies import ManagerDep, SettingsDep, abort_all, check_model, submit_all
from roseinfer.server.errors import APIError
from roseinfer.server.protocol import ChatCompletionRequest, envelope, usage
from roseinfer.server.sse import merge, reply, sse
from roseinfer.server.streams import RequestStream, StreamEnd
from roseinfer.tokenizer import ChatFormatter

router = APIRouter()


def render(req: ChatCompletionRequest, chat: ChatFormatter) -> str:
    """The conversation as the prompt text; 400 naming 'messages' if the template fails on it."""
    messages = [{"role": m.role, "content": m.text(), "name": m.name} for m in req.messages]
    try:
        return chat.render(messages)
    except Exception as exc:
        raise APIError(400, f"the chat template failed on these messages: {exc}", "messages") from exc


@router.post("/v1/chat/completions")
async def chat_completions(
    req: ChatCompletionRequest, request: Request, manager: ManagerDep, settings: SettingsDep
) -> Response:
    check_model(req, settings)
    prompt = render(req, settings.chat)
    # None: as many tokens as the context leaves after the prompt (the engine works it out).
    try:
        streams = submit_all(manager, [prompt], req.sampling_params(req.requested_max_tokens()))
    except APIError as exc:
        if exc.param == "prompt":  # the prompt is the rendered conversation: name the field the client sent
            exc.param = "messages"
        raise
    base = envelope("chatcmpl", "chat.completion.chunk", req.model)

    def to_json(results: list[tuple[str, StreamEnd]]) -> dict[str, Any]:
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

    events = chat_events(base, streams, req.include_usage) if req.stream else None
    return await reply(request, streams, abort_all(manager, streams), events, to_json)


async def chat_events(
    base: dict[str, Any], streams: list[RequestStream], include_usage: bool
) -> AsyncIterator[str]:
    """Deltas of the assistant's message, a chunk with the finish reason, usage last if asked for."""
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, str], finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**base, "choices": [choice], **extra})

    # The role goes out with the first token, not before it: a client that starts its
    # first-token clock at the first chunk (vLLM's benchmark does) then measures a real TTFT.
    role: dict[str, str] = {"role": "assistant"}
    async with aclosing(merge(streams)) as merged:
        async for _, item in merged:
            if role and isinstance(item, StreamEnd):  # ended before any text
                yield chunk({**role, "content": ""})
            if isinstance(item, StreamEnd):
                yield chunk({}, item.finish_reason)
                if include_usage:
                    yield sse(
                        {**base, "choices": [], "usage": usage(item.prompt_tokens, item.completion_tokens)}
                    )
            else:
                yield chunk({**role, "content": item})
            role = {}
