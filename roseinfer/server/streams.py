"""One request's output channel between the manager's worker and its consumer.

The worker thread is the only writer: it pushes each new token, which is
detokenized here (stop strings honoured) and flushed to the consumer every
`stream_interval` tokens (the first piece at once, the tail at the end). The
consumer is either a thread (`for piece in stream`) or an asyncio task
(`async for piece in stream`); for the latter the worker nudges the event loop
with `call_soon_threadsafe`, so nothing ever polls.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from roseinfer.detokenizer import RequestText
from roseinfer.engine.sequence import Request
from roseinfer.sampling import SamplingParams
from roseinfer.tokenizer import GPT2Tokenizer


@dataclass
class StreamEnd:
    """The last item of every stream."""

    finish_reason: str | None  # "stop" | "length"; None when the request failed
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


@dataclass
class RequestTimings:
    """perf_counter() stamps of one request's way through the server."""

    submit: float  # add_request called
    tokenized: float = 0.0
    queued: float = 0.0  # handed to the worker
    scheduled: float | None = None  # first scheduler step that included it
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each token was produced
    finished: float | None = None


class StreamClosedError(RuntimeError):
    """The request ended with an error (worker failure, shutdown)."""


class RequestStream:
    def __init__(
        self,
        request_id: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: GPT2Tokenizer,
        eos_token_ids: frozenset[int],
        stream_interval: int,
        timings: RequestTimings,
        loop: asyncio.AbstractEventLoop | None = None,
        on_consumed: Callable[[], object] | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.timings = timings
        self.end: StreamEnd | None = None  # set once the consumer has read the end
        self.request: Request | None = None  # the validated request, once it is validated
        # Worker side. The text owns the request's stop strings (and hides its EOS).
        self._text = RequestText(tokenizer, params, eos_token_ids)
        self._interval = max(1, stream_interval)
        self._pending: list[str] = []
        self._unflushed = 0
        self.num_tokens = 0
        self.finish_reason: str | None = None
        # Hand-over.
        self._queue: queue.SimpleQueue[str | StreamEnd] = queue.SimpleQueue()
        self._loop = loop
        self._ready = asyncio.Event() if loop is not None else None
        self._on_consumed = on_consumed  # called once the consumer has read the end

    # -- worker side ------------------------------------------------------------------
    def on_token(self, token_id: int, now: float) -> None:
        self.num_tokens += 1
        self.timings.token_times.append(now)
        if self.timings.first_token is None:
            self.timings.first_token = now
        if piece := self._text.push(token_id):
            self._pending.append(piece)
        self._unflushed += 1
        if self.num_tokens == 1 or self._unflushed >= self._interval:
            self._flush()

    @property
    def stopped(self) -> bool:
        """Whether a stop string has appeared: the request must end now."""
        return self._text.stopped

    def on_finish(self, finish_reason: str, now: float) -> None:
        if tail := self._text.finish():
            self._pending.append(tail)
        self._flush()
        self.finish_reason = finish_reason
        self.timings.finished = now
        self._put(StreamEnd(finish_reason, len(self.prompt_token_ids), self.num_tokens))

    def fail(self, message: str) -> None:
        self._put(StreamEnd(None, len(self.prompt_token_ids), self.num_tokens, error=message))

    def _flush(self) -> None:
        self._unflushed = 0
        if self._pending:
            self._put("".join(self._pending))
            self._pending.clear()

    def _put(self, item: str | StreamEnd) -> None:
        self._queue.put(item)
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                pass

    # -- consumer side ----------------------------------------------------------------
    def _take(self, item: str | StreamEnd) -> str | None:
        if isinstance(item, StreamEnd):
            self.end = item
            if self._on_consumed is not None:
                self._on_consumed()
            if item.error is not None:
                raise StreamClosedError(item.error)
            return None
        return item

    def __iter__(self) -> Iterator[str]:
        return self.pieces()

    def pieces(self, timeout: float | None = None) -> Iterator[str]:
        """Text pieces until the end; `timeout` bounds each wait (queue.Empty past it)."""
        while self.end is None:
            piece = self._take(self._queue.get(timeout=timeout))
            if piece is not None:
                yield piece

    async def __aiter__(self) -> AsyncIterator[str]:
        assert self._ready is not None, "pass loop= to add_request for an async consumer"
        while self.end is None:
            self._ready.clear()  # before draining: a put after this sets it again
            drained = False
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                drained = True
                piece = self._take(item)
                if piece is not None:
                    yield piece
                if self.end is not None:
                    return
            if not drained:
                await self._ready.wait()
