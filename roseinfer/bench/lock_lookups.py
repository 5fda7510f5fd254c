"""Notebook 07's measurements: the worker's per-step lookup of its streams, one lock per token or one per step.

- `acquisitions_per_step`: every step's lookup counted (lock acquisitions by the worker, requests that got a token
  or finished);
- `uncontended_lock_ns`: what one `with lock:` costs when no other thread wants the lock;
- `lookup_alone`: both versions of `_collect_step_records` called directly on a manager holding B streams;
- `serve_loads`: a decoding batch of B streams through each variant, with and without handler threads that
  submit and abort requests through the same manager (the server's handlers' use of the lock);
- `seed_runs`: the seed post's streaming workload through each variant;
- `lock_account`: the back of the envelope, a number a row (the saving against B - 1 acquisitions and a step);
- `plot_lookups`: the notebook's three panels.
"""

from __future__ import annotations

import statistics
import threading
import time
import timeit
from collections.abc import Iterable, Mapping
from typing import Any

from roseinfer.bench.instrument import count_worker_locks
from roseinfer.bench.metrics import percentile
from roseinfer.bench.stats import median
from roseinfer.bench.streaming import StreamingSetup, run_streaming
from roseinfer.history import make_manager
from roseinfer.sampling import SamplingParams

COLORS = {"lock-per-token": "#7f7f7f", "current": "#d9534f"}


def acquisitions_per_step(engine, variant: str, batch: int, new_tokens: int = 32) -> list[tuple[int, int]]:
    """(lock acquisitions by the worker, requests that got a token or finished) in every step's lookup, B streams
    served together.
    Each asks for `new_tokens`: enough that the first are still decoding when the last arrive, so some steps
    carry all B."""
    per_step: list[tuple[int, int]] = []

    def count(manager) -> None:
        lock = count_worker_locks(manager)
        collect = manager._collect_step_records

        def counted(step_tokens, finished):
            before = lock.count
            records = collect(step_tokens, finished)
            per_step.append((lock.count - before, len(records)))
            return records

        manager._collect_step_records = counted

    setup = StreamingSetup(num_requests=batch, prompt="Hello", pretok=True, max_new_tokens=new_tokens,
                           stop_on_eos=False, max_batch_size=batch)
    run_streaming(engine, variant, setup, manager_hook=count)
    return per_step


def uncontended_lock_ns(n: int = 100_000, repeat: int = 5) -> float:
    """ns one `with lock: table.get(key)` costs beyond the `table.get(key)` alone (best of `repeat` loops of n)."""
    lock, table = threading.Lock(), {key: object() for key in range(32)}

    def with_lock():
        for i in range(n):
            with lock:
                table.get(i & 31)

    def without_lock():
        for i in range(n):
            table.get(i & 31)

    return (min(timeit.repeat(with_lock, number=1, repeat=repeat))
            - min(timeit.repeat(without_lock, number=1, repeat=repeat))) / n * 1e9


def lookup_alone(engine, variants: Iterable[str], batch: int, rounds: int, calls: int = 5000) -> dict[str, list[float]]:
    """µs a `_collect_step_records` call takes for a step of `batch` requests, each variant's, `rounds` times.

    No decoding runs: the managers hold `batch` streams that only get looked up (no step runs them), and the
    variants take turns round by round, the first of each round alternating, so a slow moment hits both."""
    managers = {v: make_manager(v, engine, max_batch_size=batch) for v in variants}
    fake = {10**9 + i: object() for i in range(batch)}  # ids no step will run
    step_tokens = dict.fromkeys(fake, 0)
    times: dict[str, list[float]] = {v: [] for v in managers}
    try:
        for manager in managers.values():
            with manager._lock:
                manager._streams.update(fake)
        for r in range(rounds):
            for v in (list(managers) if r % 2 == 0 else list(managers)[::-1]):
                collect = managers[v]._collect_step_records
                start = time.perf_counter()
                for _ in range(calls):
                    collect(step_tokens, [])
                times[v].append((time.perf_counter() - start) / calls * 1e6)
    finally:
        for manager in managers.values():
            with manager._lock:
                for rid in fake:
                    manager._streams.pop(rid, None)
            manager.close()
    return times


def serve_batch(engine, variant: str, batch: int, new_tokens: int, prompt_ids: list[int], threads: int = 0,
                rate_per_s: float | None = None) -> dict[str, float]:
    """One run: `batch` greedy streams decode together while `threads` handler threads submit and abort at once.

    The handlers share `rate_per_s` requests a second (an absolute schedule: the same load for every variant).
    The manager's batch limit is `batch`, so their requests wait in the queue and are dropped before they run:
    every run decodes the same batch (asserted). Each of the batch's steps times its lookup (perf_counter around
    `_collect_step_records`); TPOT is each stream's mean gap between tokens, its median over the streams."""
    manager = make_manager(variant, engine, max_batch_size=batch)
    lookup_s: list[float] = []
    collect = manager._collect_step_records

    def timed_collect(step_tokens, finished):
        start = time.perf_counter()
        records = collect(step_tokens, finished)
        took = time.perf_counter() - start
        if any(rid < batch for rid in step_tokens.keys() | set(finished)):  # a step of the batch (ids 0..B-1)
            lookup_s.append(took)
        return records

    manager._collect_step_records = timed_collect
    params = SamplingParams(max_new_tokens=new_tokens, stop_on_eos=False)
    streams = [manager.submit(prompt_token_ids=prompt_ids, params=params) for _ in range(batch)]
    assert [s.request_id for s in streams] == list(range(batch)), "the batch's ids come first"
    stop, handled = threading.Event(), []

    def client_that_gives_up() -> None:
        quick = SamplingParams(max_new_tokens=1)
        interval = threads / rate_per_s if rate_per_s else 0.0  # this thread's share of the rate
        due = time.perf_counter()
        while not stop.is_set():
            manager.abort(manager.submit(prompt_token_ids=prompt_ids, params=quick).request_id)
            handled.append(1)
            due += interval
            wait = due - time.perf_counter()
            if wait > 0:  # a late request is followed at once by the next one due
                time.sleep(wait)

    clients = [threading.Thread(target=client_that_gives_up, daemon=True) for _ in range(threads)]
    start = time.perf_counter()
    try:
        for t in clients:
            t.start()
        for s in streams:
            for _ in s.pieces(timeout=600):
                pass
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        for t in clients:
            t.join()
        manager.close()
    assert all(len(s.timings.token_times) == new_tokens for s in streams), "every run decodes the same batch"
    tpot = [(s.timings.token_times[-1] - s.timings.token_times[0]) / (new_tokens - 1) for s in streams]
    return {"lookup_us": percentile(lookup_s, 50) * 1e6, "lookup_mean_us": statistics.mean(lookup_s) * 1e6,
            "slow_lookups": sum(x > 1e-3 for x in lookup_s), "steps": len(lookup_s),
            "tpot_ms": percentile(tpot, 50) * 1e3, "handler_req_s": len(handled) / elapsed}


def serve_loads(engine, variants: Iterable[str], loads: Mapping[str, dict[str, Any]], batch: int, new_tokens: int,
                prompt_ids: list[int], repeats: int) -> dict[str, dict[str, list[dict[str, float]]]]:
    """runs[load][variant]: `repeats` `serve_batch` runs, interleaved, the first variant alternating each time.

    loads: name -> `serve_batch` keywords (threads, rate_per_s). One warm-up run first, not kept."""
    variants = list(variants)
    serve_batch(engine, variants[-1], batch, new_tokens, prompt_ids)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {load: {v: [] for v in variants} for load in loads}
    for rep in range(repeats):
        for load, spec in loads.items():
            for v in (variants if rep % 2 == 0 else variants[::-1]):
                runs[load][v].append(serve_batch(engine, v, batch, new_tokens, prompt_ids, **spec))
    return runs


def seed_runs(engine, variants: Iterable[str], setup: StreamingSetup, repeats: int) -> dict[str, list[dict[str, float]]]:
    """The seed post's workload through each variant, interleaved: each run's queue wait and TTFT p50 (ms)."""
    variants = list(variants)
    out: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for rep in range(repeats):
        for v in (variants if rep % 2 == 0 else variants[::-1]):
            m, _ = run_streaming(engine, v, setup)
            out[v].append({"queue_wait_p50_ms": m["queue_wait_ms"]["p50"], "ttft_p50_ms": m["ttft_ms"]["p50"]})
    return out


def lock_account(alone: Mapping[str, list[float]], runs, quiet: str, busy: str, batch: int,
                 lock_ns: float) -> dict[str, float]:
    """Notebook 07's back of the envelope, for the variants "lock-per-token" (before) and "current" (after):

    predicted_us: B - 1 uncontended acquisitions; saved_us: the lookup alone's saving, round by round (median);
    step_ms: TPOT p50 after, load `quiet`; share_of_step: saved_us over that step; tpot_spread: the smaller of the two
    variants' (max - min) / median of TPOT over its runs, load `quiet`; busy_growth_x / busy_growth_ms: how much load
    `busy` grew TPOT (the smaller of the variants'); busy_lookup_us: the larger variant's median of the runs' mean
    lookup under load `busy`; lookup_share_of_growth: that over the growth; slow_lookups: lookups over 1 ms under
    load `busy`, of busy_lookups."""
    variants = ("lock-per-token", "current")
    saved_us = median([b - a for b, a in zip(alone[variants[0]], alone[variants[1]])])
    quiet_tpot = [[r["tpot_ms"] for r in runs[quiet][v]] for v in variants]
    busy_tpot = [median([r["tpot_ms"] for r in runs[busy][v]]) for v in variants]
    step_ms = median(quiet_tpot[1])
    growth_ms = min(b - median(q) for b, q in zip(busy_tpot, quiet_tpot))
    busy_lookup_us = max(median([r["lookup_mean_us"] for r in runs[busy][v]]) for v in variants)
    return {"predicted_us": (batch - 1) * lock_ns / 1000, "saved_us": saved_us,
            "saved_over_predicted": saved_us / ((batch - 1) * lock_ns / 1000), "step_ms": step_ms,
            "share_of_step": saved_us / (step_ms * 1000),
            "tpot_spread": min((max(x) - min(x)) / median(x) for x in quiet_tpot),
            "busy_growth_x": min(b / median(q) for b, q in zip(busy_tpot, quiet_tpot)), "busy_growth_ms": growth_ms,
            "busy_lookup_us": busy_lookup_us, "lookup_share_of_growth": busy_lookup_us / (growth_ms * 1000),
            "slow_lookups": sum(r["slow_lookups"] for v in variants for r in runs[busy][v]),
            "busy_lookups": sum(r["steps"] for v in variants for r in runs[busy][v])}


def _strip(ax, groups: list[Mapping[str, list[float]]], names: Mapping[str, str], ylabel: str, title: str) -> None:
    """Every run a dot, the median a short bar, the range a line; one colour per variant."""
    for g, group in enumerate(groups):
        for k, (v, name) in enumerate(names.items()):
            values, x = group[v], g + (k - 0.5) * 0.3
            ax.plot([x] * len(values), values, "o", color=COLORS.get(v, "#5b8bd0"), alpha=0.5, ms=4,
                    label=name if g == 0 else None)
            ax.plot([x - 0.1, x + 0.1], [median(values)] * 2, color=COLORS.get(v, "#5b8bd0"), lw=2.5)
            ax.plot([x, x], [min(values), max(values)], color=COLORS.get(v, "#5b8bd0"), lw=1)
    ax.set_xticks(range(len(groups)))
    ax.set(ylabel=ylabel, title=title)
    ax.grid(axis="y", alpha=0.3)


def plot_lookups(alone: Mapping[str, list[float]], runs, seed: Mapping[str, list[dict[str, float]]],
                 theirs: Mapping[str, tuple[float, float]], names: Mapping[str, str], predicted_saving_us: float):
    """Three panels: the lookup a step (alone, then in each load's batch); TPOT by load; the seed workload's TTFT."""
    from roseinfer.bench import plots

    fig, (ax1, ax2, ax3) = plots.figure(3, width=14 / 3, height=3.8)
    loads = list(runs)
    lookups = [dict(alone)] + [{v: [r["lookup_us"] for r in runs[load][v]] for v in names} for load in loads]
    _strip(ax1, lookups, names, "µs a step (a dot a run)", "the worker's lookup of its streams")
    ax1.set_xticklabels(["alone"] + [f"in the batch,\n{load}" for load in loads], fontsize=8)
    ax1.set_ylim(bottom=0)
    top = median(alone[next(iter(names))])
    ax1.annotate("", xy=(-0.35, top - predicted_saving_us), xytext=(-0.35, top),
                 arrowprops=dict(arrowstyle="->", color="#333"))
    ax1.text(-0.4, top - predicted_saving_us / 2, f"(B-1) x one\nacquisition:\n{predicted_saving_us:.1f} µs",
             ha="right", va="center", fontsize=7)
    ax1.set_xlim(-1.1, len(lookups) - 0.5)
    ax1.legend(fontsize=8)
    _strip(ax2, [{v: [r["tpot_ms"] for r in runs[load][v]] for v in names} for load in loads], names,
           "TPOT p50 (ms)", "what the streams see")
    ax2.set_xticklabels(loads, fontsize=8)
    ax2.set_ylim(bottom=0)
    _strip(ax3, [{v: [r["ttft_p50_ms"] for r in seed[v]] for v in names}], names, "TTFT p50 (ms)",
           "the seed post's workload")
    before, after = theirs["ttft_p50_ms"]
    ax3.plot([0.35], [before], "D", mfc="none", color="#1f77b4", label="052's before (their GPU)")
    ax3.plot([0.45], [after], "D", color="#1f77b4", label="052's after (their GPU)")
    ax3.set_xticks([0], ["ours (this machine) and theirs"])
    ax3.set_xlim(-0.5, 0.8)
    ax3.set_ylim(bottom=0)
    ax3.legend(fontsize=7)
    fig.tight_layout()
    return fig
