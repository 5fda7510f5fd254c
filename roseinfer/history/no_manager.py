"""Before the SchedulerManager (retired by notebook 04): no manager at all.

Each streaming request runs the engine's loop alone, in a thread of its own,
and one global lock makes them take turns: a single request decodes at a
time and every other one waits for the whole of it. It has the manager's
interface, so the server and the benchmarks can run either.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from roseinfer.engine.engine import InferenceEngine
from roseinfer.server.manager import SchedulerManager
from roseinfer.server.streams import RequestStream


class NoManager(SchedulerManager):
    variant = "no-manager"

    def __init__(self, engine: InferenceEngine, **options: Any) -> None:
        self._engine_lock = threading.Lock()  # the one global lock
        self._cancelled: set[int] = set()
        super().__init__(engine, **options)

    def _start_worker(self) -> None:
        pass  # no shared worker: each request runs in a thread of its own

    @property
    def healthy(self) -> bool:
        return self._error is None

    def _enqueue_locked(self, stream: RequestStream) -> None:
        pass

    def _after_enqueue(self, stream: RequestStream) -> None:
        threading.Thread(target=self._generate, args=(stream,), daemon=True).start()

    def _abort_locked(self, request_id: int) -> None:
        self._cancelled.add(request_id)

    def _after_abort(self) -> None:
        pass

    def _generate(self, stream: RequestStream) -> None:
        """The whole request under the global lock: stream_generate's loop, its text in the stream."""
        rid = stream.request_id
        with self._engine_lock:
            scheduler = self.engine.new_scheduler()
            scheduler.add_request(stream.request, request_id=rid)
            try:
                while scheduler.has_unfinished():
                    for token in self.engine.step(scheduler).values():
                        if rid in self._cancelled or self._stopping:
                            return
                        stream.on_token(token, time.perf_counter())
                        if stream.stopped:
                            scheduler.finish_request(rid, "stop")
                output = scheduler.pop_response(rid)
                with self._lock:
                    self._streams.pop(rid, None)
                reason = "stop" if stream.stopped else output.finish_reason
                self._finished(stream, reason, output.metrics, time.perf_counter())
            except Exception as exc:
                stream.fail(f"generation failed: {exc!r}")
            finally:
                scheduler.discard_request(rid)  # frees the KV blocks if we stopped early
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
