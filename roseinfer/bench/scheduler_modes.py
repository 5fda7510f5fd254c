"""Runs of a workload through the OnlineScheduler: the core of benchmark_scheduler.py.

    naive    each request alone, one after another
    offline  every request queued at t=0, stepped to completion (peak throughput)
    online   requests arrive over time (Poisson at `request_rate`) while the scheduler steps

Decode time is the time spent in steps that computed no prompt token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from roseinfer.bench.metrics import RequestRecord, request_metrics
from roseinfer.bench.workloads import BenchRequest, poisson_arrivals
from roseinfer.engine.scheduler import OnlineScheduler
from roseinfer.sampling import SamplingParams

MODES = ("naive", "offline", "online")


@dataclass
class SchedulerSetup:
    max_batch_size: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_cache: bool = True
    pretok: bool = True  # hand the scheduler token ids (else its text, so tokenization is timed)
    request_rate: float = float("inf")  # online mode
    seed: int = 0
    # A variant from roseinfer.history (e.g. NoPrefixCacheScheduler) or today's scheduler.
    scheduler_class: type[OnlineScheduler] = OnlineScheduler


class Run:
    """One pass over the workload through an OnlineScheduler, timing every step."""

    def __init__(self, engine, args: SchedulerSetup, params: list[SamplingParams]) -> None:
        self.engine, self.args, self.params = engine, args, params
        self.decode_s = 0.0
        self.steps = 0
        self.kv_stats: dict[str, Any] = {}  # the scheduler's counters after an online/offline run

    def scheduler(self) -> OnlineScheduler:
        return self.engine.new_scheduler(
            self.args.scheduler_class,
            max_batch_size=self.args.max_batch_size,
            max_num_batched_tokens=self.args.max_num_batched_tokens,
            enable_prefix_cache=self.args.enable_prefix_cache,
        )

    def add(self, scheduler, req: BenchRequest, p: SamplingParams) -> int:
        if self.args.pretok or req.prompt is None:
            return self.engine.add_request(scheduler, prompt_token_ids=req.prompt_token_ids, params=p)
        return self.engine.add_request(scheduler, prompt=req.prompt, params=p)

    def step(self, scheduler, records: dict[int, RequestRecord]) -> None:
        start = time.perf_counter()
        produced = self.engine.step(scheduler)
        now = time.perf_counter()
        self.steps += 1
        if scheduler.last_step_stats()["num_prompt_tokens"] == 0:
            self.decode_s += now - start
        for rid in produced:
            records[rid].token_times.append(now)

    @staticmethod
    def _finish_record(rec: RequestRecord, out) -> None:
        rec.scheduled = out.metrics.first_scheduled_time
        rec.extra["cached_tokens"] = out.metrics.num_cached_tokens

    def naive(self, workload) -> list[RequestRecord]:
        records = []
        for req, p in zip(workload, self.params):
            scheduler = self.scheduler()
            rec = RequestRecord(start=time.perf_counter(), prompt_tokens=len(req.prompt_token_ids))
            rid = self.add(scheduler, req, p)
            while scheduler.has_unfinished():
                self.step(scheduler, {rid: rec})
            self._finish_record(rec, scheduler.pop_response(rid))
            records.append(rec)
        return records

    def offline(self, workload) -> list[RequestRecord]:
        return self.online(workload, [0.0] * len(workload))

    def online(self, workload, arrivals: list[float]) -> list[RequestRecord]:
        scheduler = self.scheduler()
        records: dict[int, RequestRecord] = {}
        t0 = time.perf_counter()
        i = 0
        while i < len(workload) or scheduler.has_unfinished():
            now = time.perf_counter()
            while i < len(workload) and t0 + arrivals[i] <= now:
                rec = RequestRecord(start=t0 + arrivals[i], prompt_tokens=len(workload[i].prompt_token_ids))
                records[self.add(scheduler, workload[i], self.params[i])] = rec
                i += 1
            if scheduler.has_unfinished():
                self.step(scheduler, records)
            elif i < len(workload):
                time.sleep(max(0.0, t0 + arrivals[i] - time.perf_counter()))
        for rid, rec in records.items():
            self._finish_record(rec, scheduler.pop_response(rid))
        self.kv_stats = scheduler.kv_stats()
        return list(records.values())


def run_mode(engine, args: SchedulerSetup, mode: str, workload: list[BenchRequest], params) -> dict[str, Any]:
    """One pass over the workload in `mode`; request metrics plus decode/total time and throughputs."""
    run = Run(engine, args, params)
    engine.block_manager.reset_prefix_cache()
    start = time.perf_counter()
    if mode == "naive":
        records = run.naive(workload)
    elif mode == "offline":
        records = run.offline(workload)
    else:
        records = run.online(workload, poisson_arrivals(len(workload), args.request_rate, seed=args.seed))
    total = time.perf_counter() - start
    metrics = request_metrics(records, total)
    out_tokens = metrics["total_output_tokens"]
    metrics.update(
        kv=run.kv_stats,
        # Per request, in arrival order: prompt tokens found in the prefix cache, and TTFT.
        cached_tokens=[int(r.extra.get("cached_tokens", 0)) for r in records],
        ttfts_ms=[1000 * r.ttft for r in records if r.ttft is not None],
        total_time_s=total,
        decode_time_s=run.decode_s,
        steps=run.steps,
        completion_tok_s_over_decode=out_tokens / run.decode_s if run.decode_s else float("nan"),
        completion_tok_s_over_total=out_tokens / total,
    )
    return metrics
