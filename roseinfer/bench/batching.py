"""Static batching (roseinfer.history) vs continuous batching (OnlineScheduler), on the same requests.

The core of benchmarks/benchmark_batching.py and notebooks 02 and 03. Each
runner returns (seconds, greedy tokens per request, info).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from roseinfer.bench.workloads import BenchRequest
from roseinfer.history.static_batching import StaticBatchGenerator
from roseinfer.sampling import SamplingParams


def _params(requests: list[BenchRequest]) -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in requests]


def run_one_at_a_time(engine, requests: list[BenchRequest]) -> tuple[float, list[list[int]], dict[str, Any]]:
    """Before batching: each request runs alone, start to finish, then the next.

    No prefix cache: a repeated run would otherwise find its prompts' blocks cached and prefill less
    than the static batch it is compared with (which has no cache)."""
    start = time.perf_counter()
    tokens = [
        engine.generate([r.prompt_token_ids], p, enable_prefix_cache=False)[0].token_ids
        for r, p in zip(requests, _params(requests))
    ]
    return time.perf_counter() - start, tokens, {"steps": sum(r.max_new_tokens for r in requests)}


def run_static(
    engine, requests: list[BenchRequest], batch_size: int
) -> tuple[float, list[list[int]], dict[str, Any]]:
    start = time.perf_counter()
    stats = StaticBatchGenerator(engine, batch_size).generate(
        [r.prompt_token_ids for r in requests], _params(requests)
    )
    elapsed = time.perf_counter() - start
    return elapsed, stats.token_ids, {"steps": stats.steps, "wasted_fraction": stats.wasted_fraction}


def run_continuous(
    engine, requests: list[BenchRequest], batch_size: int
) -> tuple[float, list[list[int]], dict[str, Any]]:
    scheduler = engine.new_scheduler(max_batch_size=batch_size, enable_prefix_cache=False)
    start = time.perf_counter()
    rids = [
        engine.add_request(scheduler, prompt_token_ids=r.prompt_token_ids, params=p)
        for r, p in zip(requests, _params(requests))
    ]
    while scheduler.has_unfinished():
        engine.step(scheduler)
    elapsed = time.perf_counter() - start
    tokens = [scheduler.pop_response(r).token_ids for r in rids]
    return elapsed, tokens, {"steps": scheduler.kv_stats()["num_steps"], "wasted_fraction": 0.0}


# -- requests that arrive over time (notebook 03) -----------------------------------------------
#
# Arrivals are scheduled on a clock that counts forward steps, not seconds: request i arrives
# once `arrival_step[i]` steps have run (idle gaps are skipped). On any machine, fast, slow or
# shared, the same requests then meet the same batches, so who waits and which rows are
# wasted is a property of the two schedulers, not of the machine's speed at the time; every
# duration is still measured in seconds, from the steps actually run.


@dataclass
class StepRecord:
    start_s: float  # seconds since the run began
    end_s: float
    rows: int  # entries in the batch the runner computed
    sampled: int  # of which sampled a token (every row of a decode step)
    tokens: int = 0  # tokens fed in: more than `rows` when some row carries prompt tokens
    clock: int = 0  # the step clock's reading when it began (skipped idle steps count: see StepClock)

    @property
    def has_prompt(self) -> bool:
        """A step that computes prompt tokens (prefill); a pure decode step feeds one token per row."""
        return self.tokens > self.rows

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass
class ArrivalRun:
    """One run of a workload whose requests arrive over time, as the engine actually stepped it."""

    batch_size: int
    arrival_step: list[int]  # per request, the step count at which it arrived (the workload's schedule)
    start_step: list[int]  # the step count when its first forward step began
    arrival_s: list[float]  # when it arrived, in seconds since the run began
    start_s: list[float]  # when its first forward step began
    first_token_s: list[float]
    finish_s: list[float]  # when its last token was produced
    token_ids: list[list[int]]
    steps: list[StepRecord]
    useful_rows: list[int]  # per step, rows that belonged to a request not yet finished
    wall_s: float = 0.0  # the whole serving loop, scheduler's Python between steps included

    @property
    def queue_wait_steps(self) -> list[int]:
        return [s - a for s, a in zip(self.start_step, self.arrival_step)]

    @property
    def queue_wait_ms(self) -> list[float]:
        return [(s - a) * 1000 for s, a in zip(self.start_s, self.arrival_s)]

    @property
    def ttft_ms(self) -> list[float]:
        return [(f - a) * 1000 for f, a in zip(self.first_token_s, self.arrival_s)]

    @property
    def model_s(self) -> float:
        """Time inside runner.execute only: the forward passes and sampling."""
        return sum(s.seconds for s in self.steps)

    @property
    def output_tok_s(self) -> float:
        """Tokens over the time spent in the model's steps (idle gaps between arrivals are skipped,
        not waited; the scheduler's work between steps is not counted: see wall_tok_s)."""
        return sum(map(len, self.token_ids)) / self.model_s

    @property
    def wall_tok_s(self) -> float:
        """Tokens over the serving loop's wall time: model steps plus the bookkeeping between them."""
        return sum(map(len, self.token_ids)) / self.wall_s

    @property
    def bookkeeping_fraction(self) -> float:
        """Share of the loop's wall time spent outside the model (scheduling, admission, outputs)."""
        return 1 - self.model_s / self.wall_s

    @property
    def wasted_rows(self) -> int:
        """Rows that sampled a token nobody kept (their request had already finished)."""
        return sum(s.sampled for s in self.steps) - sum(map(len, self.token_ids))

    @property
    def wasted_fraction(self) -> float:
        sampled = sum(s.sampled for s in self.steps)
        return self.wasted_rows / sampled if sampled else 0.0

    @property
    def slots_denied(self) -> int:
        """Batch slots, summed over steps, not given to a live request while an arrived one was waiting."""
        denied = 0
        for step, useful in zip(self.steps, self.useful_rows):
            k = step.clock  # arrivals and starts are clock readings, which count skipped idle steps too
            waiting = sum(a <= k < s for a, s in zip(self.arrival_step, self.start_step))
            denied += min(waiting, self.batch_size - useful)
        return denied


class StepClock:
    """Wraps the runner's execute for one run: records every forward step, and counts them as time."""

    def __init__(self, runner) -> None:
        self.runner, self.steps, self.t0 = runner, [], time.perf_counter()
        self.skipped = 0  # idle steps jumped over while nothing had arrived

    @property
    def now(self) -> int:
        return len(self.steps) + self.skipped

    def seconds_at(self, step: int) -> float:
        """Wall time (since t0) at which the clock read `step`: the end of the last step run before that
        reading. An idle gap takes no time, so a reading inside or at the end of one is the end of the step
        before the gap; skips can happen anywhere in a run, so each step's own reading decides, not the total."""
        before = [s.end_s for s in self.steps if s.clock < step]
        return before[-1] if before else 0.0

    def __enter__(self) -> StepClock:
        original = self.runner.execute

        def execute(batch):
            clock, start = self.now, time.perf_counter() - self.t0
            out = original(batch)
            sampled, tokens = sum(e.sample for e in batch), sum(len(e.token_ids) for e in batch)
            end = time.perf_counter() - self.t0
            self.steps.append(StepRecord(start, end, len(batch), sampled, tokens, clock))
            return out

        self.runner.execute = execute  # an instance attribute: the class's method is untouched
        return self

    def __exit__(self, *exc) -> None:
        del self.runner.execute


def serve_static(
    engine, requests: list[BenchRequest], arrival_step: list[int], batch_size: int
) -> ArrivalRun:
    """A static-batching server: when idle, it takes up to batch_size arrived requests and runs
    them until the longest is done; whoever arrives meanwhile waits for that."""
    n, params = len(requests), _params(requests)
    start_step, start, first, finish = [0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    tokens: list[list[int]] = [[] for _ in range(n)]
    useful: list[int] = []
    arrived, queue = 0, []  # requests are in arrival order
    with StepClock(engine.runner) as clock:
        while arrived < n or queue:
            while arrived < n and arrival_step[arrived] <= clock.now:
                queue.append(arrived)
                arrived += 1
            if not queue:
                clock.skipped += arrival_step[arrived] - clock.now
                continue
            group, queue = queue[:batch_size], queue[batch_size:]
            first_step, group_start = len(clock.steps), clock.now
            outs = (
                StaticBatchGenerator(engine, batch_size)
                .generate([requests[i].prompt_token_ids for i in group], [params[i] for i in group])
                .token_ids
            )
            steps = clock.steps[first_step:]
            useful += [sum(len(o) > k for o in outs) for k in range(len(steps))]
            for i, out in zip(group, outs):
                tokens[i], start_step[i] = out, group_start
                start[i], first[i] = steps[0].start_s, steps[0].end_s
                finish[i] = steps[len(out) - 1].end_s  # its own last token; its row runs on after
        wall = time.perf_counter() - clock.t0
    arrival_s = [clock.seconds_at(a) for a in arrival_step]
    return ArrivalRun(
        batch_size,
        list(arrival_step),
        start_step,
        arrival_s,
        start,
        first,
        finish,
        tokens,
        clock.steps,
        useful,
        wall,
    )


def serve_continuous(
    engine, requests: list[BenchRequest], arrival_step: list[int], batch_size: int
) -> ArrivalRun:
    """The OnlineScheduler stepped as a server does: each step first admits whatever has arrived."""
    n, params = len(requests), _params(requests)
    scheduler = engine.new_scheduler(max_batch_size=batch_size, enable_prefix_cache=False)
    rids: list[int] = []
    start_step: list[int | None] = [None] * n
    with StepClock(engine.runner) as clock:
        while len(rids) < n or scheduler.has_unfinished():
            while len(rids) < n and arrival_step[len(rids)] <= clock.now:
                i = len(rids)
                rids.append(
                    engine.add_request(scheduler, prompt_token_ids=requests[i].prompt_token_ids, params=params[i])
                )
            if not scheduler.has_unfinished():
                clock.skipped += arrival_step[len(rids)] - clock.now
                continue
            step = clock.now
            engine.step(scheduler)
            for i, rid in enumerate(rids):  # a request has started once it took part in a step
                if start_step[i] is None and scheduler.get_step_count(rid) > 0:
                    start_step[i] = step
        wall = time.perf_counter() - clock.t0
    outs = [scheduler.pop_response(r) for r in rids]
    # Every row the scheduler computes belongs to a live request: a finished one has left the batch.
    useful = [s.rows for s in clock.steps]
    m = [o.metrics for o in outs]
    t0 = clock.t0
    return ArrivalRun(
        batch_size,
        list(arrival_step),
        start_step,
        [clock.seconds_at(a) for a in arrival_step],
        [x.first_scheduled_time - t0 for x in m],
        [x.first_token_time - t0 for x in m],
        [x.finish_time - t0 for x in m],
        [o.token_ids for o in outs],
        clock.steps,
        useful,
        wall,
    )
