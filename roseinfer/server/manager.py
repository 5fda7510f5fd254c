"""SchedulerManager: one worker thread steps the engine over an OnlineScheduler for many streams.

    manager = SchedulerManager(engine, stream_interval=4)
    rid = manager.add_request(prompt="Hello", params=SamplingParams(max_new_tokens=32))
    for piece in manager.stream_text(rid):
        print(piece, end="")

Threads:
- Callers (HTTP handlers) validate in their own thread (`engine.validate`
  tokenizes and checks, once), outside the lock; then, under the lock, they queue the request with its
  RequestStream; then they set the wake-up event. With `tokenize_workers=N`
  a pool of N threads tokenizes and queues instead, and `submit` returns as
  soon as the stream exists (the seed posts' benchmark measures both ways).
- The worker is the only thread that touches the scheduler. When it has
  nothing to do it clears the event *under the lock* and then waits on it,
  so a request queued between its check and its wait still wakes it: no
  polling and no lost wake-up. When it has work it runs `engine.step`, takes
  the lock once to fetch the stream of every request that got a token or
  finished, and detokenizes and delivers outside the lock. A request's stream
  owns its text, stop strings included: when one appears, the worker ends the
  request in the scheduler (`finish_request`) before the next step.

The scheduler is used only through its public methods. The seams
`_wait_for_work`, `_idle`, `_collect_step_records` and `_pop_finished` are
what the earlier versions in roseinfer.history override (listed, with every
other pinned method, in `roseinfer.history.TEACHING_SEAMS`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from roseinfer.engine.engine import InferenceEngine
from roseinfer.engine.openmp import release_openmp_workers
from roseinfer.engine.sequence import RequestMetrics
from roseinfer.sampling import SamplingParams
from roseinfer.server.loads import GenerationMarks, generation_rate
from roseinfer.server.streams import RequestStream, RequestTimings

logger = logging.getLogger("roseinfer.server")

FinishedCallback = Callable[[RequestStream, RequestMetrics], object]


class OverloadedError(RuntimeError):
    """Too many requests in flight (HTTP 429)."""


class EngineDeadError(RuntimeError):
    """The worker has failed or the server is shutting down (HTTP 503)."""


class DrainingError(EngineDeadError):
    """The server is draining: it finishes the requests it admitted and takes no new one (HTTP 503, Retry-After)."""


class Manager(Protocol):
    """What the server needs from a manager (SchedulerManager, or a history variant)."""

    engine: InferenceEngine

    def submit(
        self,
        prompt: str | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> RequestStream: ...

    def abort(self, request_id: int) -> None: ...

    def close(self, timeout: float = 10.0) -> None: ...

    def drain(self, timeout: float) -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    @property
    def draining(self) -> bool: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def error(self) -> BaseException | None: ...


@dataclass
class StepRecord:
    """What the worker needs, outside the lock, to deliver one request's step."""

    stream: RequestStream
    token: int | None
    finished: bool


class SchedulerManager:
    variant = "current"

    def __init__(
        self,
        engine: InferenceEngine,
        *,
        stream_interval: int = 1,
        max_inflight_requests: int | None = None,
        on_finished: FinishedCallback | None = None,
        tokenize_workers: int = 0,
        **limits: Any,
    ) -> None:
        """`limits` are SchedulerLimits fields (max_batch_size, max_num_batched_tokens, ...)."""
        self.engine = engine
        self.stream_interval = stream_interval
        self.max_inflight_requests = max_inflight_requests
        self._on_finished = on_finished  # e.g. Prometheus histograms
        self._scheduler = engine.new_scheduler(**limits)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._streams: dict[int, RequestStream] = {}  # requests not finished yet
        self._channels: dict[int, RequestStream] = {}  # streams not fully read yet
        self._stopping = False
        self._draining = False  # drain(): no new request, the admitted ones run to their end
        self._error: BaseException | None = None
        # 0: callers tokenize in their own thread; N: a pool of N threads does, so submit returns at once.
        self.tokenize_workers = tokenize_workers
        self._tokenize_pool = (
            ThreadPoolExecutor(tokenize_workers, thread_name_prefix="roseinfer-tokenize")
            if tokenize_workers > 0
            else None
        )
        # Steps run in other threads than this one: free this thread's OpenMP pool, so that
        # libgomp does not throttle the stepping thread's workers (roseinfer.engine.openmp).
        release_openmp_workers()
        # The detokenizer's id -> bytes table is built on first use (~45 ms of Python for
        # GPT-2's 50,257 tokens): build it now, not while the first request waits for its token.
        engine.tokenizer.token_bytes(0)
        self._wakeup = threading.Event()
        self._pending: list[RequestStream] = []  # queued by callers, not yet in the scheduler
        self._aborts: list[int] = []  # aborted after reaching the scheduler
        self._generation_marks = GenerationMarks()
        self._stats: dict[str, Any] = self._scheduler_stats()
        self.num_idle_wakeups = 0  # how often the idle worker woke up (notebook 05 counts them)
        self._start_worker()

    def _start_worker(self) -> None:
        self._worker = threading.Thread(target=self._worker_loop, name="roseinfer-worker", daemon=True)
        self._worker.start()

    def submit(
        self,
        prompt: str | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> RequestStream:
        """Queue a request; returns its stream. Pass `loop` to read it with `async for`.

        With tokenize workers, it returns before the prompt is tokenized; a
        prompt that turns out invalid then ends its stream with the error.
        """
        params = params or SamplingParams()
        timings = RequestTimings(submit=time.perf_counter())
        if self._tokenize_pool is not None:
            stream = self._register([], params, timings, loop)
            self._tokenize_pool.submit(self._tokenize_and_queue, stream, prompt, prompt_token_ids)
            return stream
        # Tokenize and validate in the caller's thread, outside the lock.
        request = self.engine.validate(prompt, prompt_token_ids, params)
        timings.tokenized = time.perf_counter()
        stream = self._register(request.prompt_token_ids, request.params, timings, loop)
        stream.request = request
        self._queue(stream)
        return stream

    def _register(
        self,
        token_ids: list[int],
        params: SamplingParams,
        timings: RequestTimings,
        loop: asyncio.AbstractEventLoop | None,
    ) -> RequestStream:
        with self._lock:
            if self._error is not None:
                raise EngineDeadError(f"the engine worker failed: {self._error!r}")
            if self._stopping:
                raise EngineDeadError("the server is shutting down")
            if self._draining:
                raise DrainingError("the server is draining (finishing its requests before it stops): "
                                    "send this one to another replica")
            if self.max_inflight_requests is not None and len(self._streams) >= self.max_inflight_requests:
                raise OverloadedError(
                    f"{len(self._streams)} requests in flight, the limit is {self.max_inflight_requests}"
                )
            rid = next(self._ids)
            stream = RequestStream(
                rid,
                token_ids,
                params,
                self.engine.tokenizer,
                self.engine.eos_token_ids,
                self.stream_interval,
                timings,
                loop,
                on_consumed=lambda: self._channels.pop(rid, None),
            )
            self._streams[rid] = self._channels[rid] = stream
        return stream

    def _queue(self, stream: RequestStream) -> None:
        with self._lock:
            if self._streams.get(stream.request_id) is not stream:
                return  # aborted, or ended by a shutdown, while it was being tokenized
            self._enqueue_locked(stream)
            stream.timings.queued = time.perf_counter()
        self._after_enqueue(stream)

    def _tokenize_and_queue(
        self, stream: RequestStream, prompt: str | None, prompt_token_ids: list[int] | None
    ) -> None:
        """In a tokenize worker: tokenize and validate, then queue (or end the stream with the error)."""
        try:
            stream.request = self.engine.validate(prompt, prompt_token_ids, stream.params)
            stream.prompt_token_ids = stream.request.prompt_token_ids
        except Exception as exc:
            with self._lock:
                self._streams.pop(stream.request_id, None)
            stream.fail(f"invalid request: {exc}")
            return
        stream.timings.tokenized = time.perf_counter()
        self._queue(stream)

    def add_request(self, prompt=None, prompt_token_ids=None, params=None, loop=None) -> int:
        """Queue a request; returns its id (read it with `stream_text(id)`)."""
        return self.submit(prompt, prompt_token_ids, params, loop).request_id

    def stream(self, request_id: int) -> RequestStream:
        stream = self._channels.get(request_id)
        if stream is None:
            raise KeyError(f"no open stream for request {request_id}")
        return stream

    def stream_text(self, request_id: int) -> Iterator[str]:
        """Text pieces as they are flushed; raises StreamClosedError if the request fails."""
        return iter(self.stream(request_id))

    def abort(self, request_id: int) -> None:
        """Drop a request whose client went away; its KV blocks are freed."""
        with self._lock:
            self._channels.pop(request_id, None)
            if self._streams.pop(request_id, None) is None:
                return
            self._abort_locked(request_id)
        self._after_abort()

    def _end_all_streams(self, message: str) -> None:
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.fail(message)
        if self._tokenize_pool is not None:
            self._tokenize_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def error(self) -> BaseException | None:
        return self._error

    def _finished(
        self, stream: RequestStream, finish_reason: str, metrics: RequestMetrics, now: float
    ) -> None:
        stream.timings.scheduled = metrics.first_scheduled_time
        stream.on_finish(finish_reason, now)
        if self._on_finished is not None:
            self._on_finished(stream, metrics)

    # -- callers ----------------------------------------------------------------------
    def _enqueue_locked(self, stream: RequestStream) -> None:
        self._pending.append(stream)

    def _after_enqueue(self, stream: RequestStream) -> None:
        self._wakeup.set()

    def _abort_locked(self, request_id: int) -> None:
        before = len(self._pending)
        self._pending = [s for s in self._pending if s.request_id != request_id]
        if len(self._pending) == before:  # already in the scheduler: the worker discards it
            self._aborts.append(request_id)

    def _after_abort(self) -> None:
        self._wakeup.set()

    def drain(self, timeout: float) -> bool:
        """Take no new request, and wait until every admitted one has been read to its end by its consumer
        (True), or `timeout` seconds (False: what is left is for close() to end). The worker keeps stepping."""
        with self._lock:
            self._draining = True
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._streams and not self._channels:
                    return True
            if time.monotonic() >= deadline or not self.healthy:
                return False
            time.sleep(0.02)

    @property
    def draining(self) -> bool:
        return self._draining

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker, end every open stream, join."""
        with self._lock:
            self._stopping = True
            self._pending.clear()
        self._wakeup.set()
        if self._worker is not threading.current_thread():
            self._worker.join(timeout)
        self._end_all_streams("the server is shutting down")

    @property
    def healthy(self) -> bool:
        return self._error is None and self._worker.is_alive()

    def stats(self) -> dict[str, Any]:
        """Scheduler and KV-pool counters as of the last step (safe from any thread)."""
        stats = self._stats
        waiting = stats["num_waiting"] + len(self._pending)  # queued, not yet handed to the scheduler
        pending_tokens = sum(len(s.prompt_token_ids or ()) for s in list(self._pending))
        return {
            **stats,
            "num_waiting": waiting,
            "num_waiting_tokens": stats.get("num_waiting_tokens", 0) + pending_tokens,
            "generation_throughput": generation_rate(stats.get("generation_marks", ()), time.monotonic()),
            "inflight_requests": len(self._streams),
            "healthy": self.healthy,
        }

    # -- worker ---------------------------------------------------------------------
    def _worker_loop(self) -> None:
        try:
            while self._take_new_work():
                if not self._scheduler.has_unfinished():
                    self._idle()
                    continue
                step_tokens = self.engine.step(self._scheduler)
                finished = self._scheduler.pop_finished_ids()
                self._publish_stats()
                self._deliver(self._collect_step_records(step_tokens, finished))
        except BaseException as exc:
            self._fail(exc)

    def _take_new_work(self) -> bool:
        """Move queued requests and aborts into the scheduler; False once stopping."""
        with self._lock:
            if self._stopping:
                return False
            pending, self._pending = self._pending, []
            aborts, self._aborts = self._aborts, []
        for rid in aborts:
            self._scheduler.discard_request(rid)
        for s in pending:
            try:
                self._scheduler.add_request(s.request, request_id=s.request_id)
            except Exception as exc:  # validated by the caller, so this is a bug: it costs one request
                self._fail_request(s, exc, scheduled=False)
        if aborts:
            self._publish_stats()
        return True

    def _idle(self) -> None:
        with self._lock:
            if self._pending or self._aborts or self._stopping:
                return
            # Cleared under the lock: add_request queues under this lock and sets
            # the event after releasing it, so its set() cannot precede this clear().
            self._wakeup.clear()
        self._wait_for_work()
        self.num_idle_wakeups += 1

    def _wait_for_work(self) -> None:
        self._wakeup.wait()

    def _collect_step_records(self, step_tokens: dict[int, int], finished: list[int]) -> list[StepRecord]:
        """One lock acquisition for the whole step: the stream of every request with news."""
        done = set(finished)
        records = []
        with self._lock:
            for rid in step_tokens.keys() | done:
                stream = self._streams.pop(rid, None) if rid in done else self._streams.get(rid)
                if stream is not None:  # None: aborted meanwhile
                    records.append(StepRecord(stream, step_tokens.get(rid), rid in done))
        return records

    def _deliver(self, records: list[StepRecord]) -> None:
        """Detokenize and hand over, outside the lock.

        A failure that belongs to one request (its stop strings, its text)
        ends that request alone, with an error on its stream; only a failure
        of the step itself (`_worker_loop`) ends every stream.
        """
        now = time.perf_counter()
        for record in records:
            stream = record.stream
            try:
                if record.token is not None:
                    stream.on_token(record.token, now)
                if record.finished or stream.stopped:
                    self._finish_stream(stream, record.finished, now)
            except Exception as exc:
                self._fail_request(stream, exc, scheduled=True)

    def _finish_stream(self, stream: RequestStream, popped: bool, now: float) -> None:
        """End a finished request's stream; one that hit a stop string is finished here first."""
        rid = stream.request_id
        if not popped:  # the stream saw a stop string: end the request before the next step
            self._scheduler.finish_request(rid, "stop")
            with self._lock:
                self._streams.pop(rid, None)
        finish_reason, metrics = self._pop_finished(rid)
        self._finished(stream, "stop" if stream.stopped else finish_reason, metrics, now)

    def _fail_request(self, stream: RequestStream, exc: Exception, scheduled: bool) -> None:
        """End one request with an error; the others are untouched. Worker thread only."""
        logger.exception("request %s failed; the others go on", stream.request_id, exc_info=exc)
        with self._lock:
            self._streams.pop(stream.request_id, None)
        if scheduled:
            self._scheduler.discard_request(stream.request_id)  # frees its KV blocks
        stream.fail(f"this request failed in the engine: {exc}")

    def _pop_finished(self, request_id: int) -> tuple[str, RequestMetrics]:
        """Take a finished request out of the scheduler, through its public accessor."""
        out = self._scheduler.pop_response(request_id)
        return out.finish_reason, out.metrics

    def _scheduler_stats(self) -> dict[str, Any]:
        kv = self._scheduler.kv_stats()
        return {
            "num_running": self._scheduler.num_running(),
            "num_waiting": self._scheduler.num_waiting(),
            "num_waiting_tokens": self._scheduler.num_waiting_tokens(),
            "max_running_requests": self._scheduler.limits.max_batch_size,
            "kv_cache_usage": kv["used_blocks"] / kv["total_blocks"],
            **kv,
        }

    def _publish_stats(self) -> None:
        stats = self._scheduler_stats()
        stats["generation_marks"] = self._generation_marks.add(time.monotonic(), stats["num_generated_tokens"])
        # Swapping one reference is atomic: readers see the old dict or the new one.
        self._stats = stats

    def _fail(self, exc: BaseException) -> None:
        logger.exception("roseinfer worker failed; every open stream ends with an error", exc_info=exc)
        with self._lock:
            self._error = exc
            self._pending.clear()
        # The last step's gauges no longer describe anything: nothing runs, nothing waits.
        self._stats = {**self._stats, "num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0}
        self._end_all_streams(f"the engine worker failed: {exc!r}")
