"""Before the SchedulerManager (retired by notebook 04): no manager at all.

Each streaming request runs `engine.stream_generate` in a thread of its own,
and one global lock makes them take turns: a single request decodes at a
time and every other one waits for the whole of it. It has the manager's
interface, so the server and the benchmarks can run either.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from roseinfer.engine.engine import InferenceEngine
from roseinfer.engine.scheduler import OnlineScheduler
from roseinfer.server.manager import FinishedCallback, StreamingFrontend
from roseinfer.server.streams import RequestStream


class NoManager(StreamingFrontend):
    variant = "no-manager"

    def __init__(
        self,
        engine: InferenceEngine,
        *,
        stream_interval: int = 1,
        max_inflight_requests: int | None = None,
        on_finished: FinishedCallback | None = None,
        tokenize_workers: int = 0,
        **_scheduler_options: Any,  # there is no shared scheduler to configure
    ) -> None:
        super().__init__(
            engine,
            OnlineScheduler(engine),
            stream_interval,
            max_inflight_requests,
            on_finished,
            tokenize_workers,
        )
        self._engine_lock = threading.Lock()  # the one global lock
        self._cancelled: set[int] = set()

    def _enqueue_locked(self, stream: RequestStream) -> None:
        pass

    def _after_enqueue(self, stream: RequestStream) -> None:
        threading.Thread(target=self._generate, args=(stream,), daemon=True).start()

    def _abort_locked(self, request_id: int) -> None:
        self._cancelled.add(request_id)

    def _generate(self, stream: RequestStream) -> None:
        rid = stream.request_id
        with self._engine_lock:
            # engine.stream_tokens is stream_generate before detokenization: the
            # RequestStream detokenizes, exactly as under the manager.
            tokens = self.engine.stream_tokens(stream.prompt_token_ids, stream.params)
            try:
                while True:
                    try:
                        token = next(tokens)
                    except StopIteration as done:
                        output = done.value
                        break
                    if rid in self._cancelled or self._stopping:
                        return
                    stream.on_token(token, time.perf_counter())
                with self._lock:
                    self._streams.pop(rid, None)
                self._finished(stream, output.finish_reason, output.metrics, time.perf_counter())
            except Exception as exc:
                stream.fail(f"generation failed: {exc!r}")
            finally:
                tokens.close()  # frees the KV blocks if we stopped early
                with self._lock:
                    self._cancelled.discard(rid)

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopping = True
        self._end_all_streams("the server is shutting down")

    def stats(self) -> dict[str, Any]:
        blocks = self.engine.block_manager
        inflight = len(self._streams)
        running = 1 if self._engine_lock.locked() else 0
        return {
            "num_running": running,
            "num_waiting": max(0, inflight - running),
            "kv_cache_usage": blocks.num_used_blocks / blocks.num_blocks,
            "used_blocks": blocks.num_used_blocks,
            "total_blocks": blocks.num_blocks,
            "inflight_requests": inflight,
        }
