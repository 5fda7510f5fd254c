"""GET /v1/loads: what a gateway routes on, in the schema SMG (SGLang's router) reads from its workers.

SMG polls each worker's /v1/loads (every `--load-monitor-interval` seconds) and routes on it: least-load
and power-of-two on the waiting prompt tokens, the generation rate and the KV usage; cache-aware on the
KV usage. A worker without the endpoint is routed on SMG's guesses. The report is built from the
manager's last-step snapshot, so a poll costs a dict's copy, never a step. SMG's parser takes integers
for counts and a string timestamp; one rank (no data parallelism here).
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timezone
from typing import Any

RATE_WINDOW_S = 10.0  # the generation rate is over about this much of the recent past
MARK_EVERY_S = 0.5  # one mark of (time, tokens so far) this often: the window holds about 20


class GenerationMarks:
    """(time, tokens generated so far) now and then, over the last RATE_WINDOW_S; the worker alone adds."""

    def __init__(self) -> None:
        self._marks: deque[tuple[float, int]] = deque()

    def add(self, now: float, total: int) -> tuple[tuple[float, int], ...]:
        """Record the running total at `now` (kept at most every MARK_EVERY_S); the marks a reader needs."""
        if not self._marks or now - self._marks[-1][0] >= MARK_EVERY_S:
            self._marks.append((now, total))
        while len(self._marks) > 1 and now - self._marks[1][0] >= RATE_WINDOW_S:
            self._marks.popleft()
        return (*self._marks, (now, total))


def generation_rate(marks: tuple[tuple[float, int], ...], now: float) -> float:
    """Tokens a second over the window that ends now: 0 once nothing was generated for a whole window."""
    recent = [m for m in marks if now - m[0] <= RATE_WINDOW_S]
    if len(recent) < 2 or now <= recent[0][0]:
        return 0.0
    return (recent[-1][1] - recent[0][1]) / (now - recent[0][0])


def load_report(stats: dict[str, Any]) -> dict[str, Any]:
    """The manager's stats() as SMG's WorkerLoadResponse: {timestamp, dp_rank_count, loads: [one rank]}."""
    # .get: any Manager's stats() (a history variant's may lack the scheduler's newer counters)
    block_size = stats.get("block_size", 0)
    used, total = stats.get("used_blocks", 0) * block_size, stats.get("total_blocks", 0) * block_size
    running, waiting = stats.get("num_running", 0), stats.get("num_waiting", 0)
    max_running = stats.get("max_running_requests", 0)
    return {
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "dp_rank_count": 1,
        "loads": [{
            "dp_rank": 0,
            "num_running_reqs": int(running),
            "num_waiting_reqs": int(waiting),
            # prompt tokens still to prefill, before prefix-cache hits (an upper bound of SMG's "uncached")
            "num_waiting_uncached_tokens": int(stats.get("num_waiting_tokens", 0)),
            "num_total_reqs": int(running + waiting),
            "num_used_tokens": int(used),
            "max_total_num_tokens": int(total),
            "token_usage": used / total if total else 0.0,
            "gen_throughput": float(stats.get("generation_throughput", 0.0)),
            "cache_hit_rate": float(stats.get("prefix_cache_hit_rate", 0.0)),
            "utilization": running / max_running if max_running else 0.0,
            "max_running_requests": int(max_running),
        }],
    }
