"""Notebook 06's measurements: what reading a request through the scheduler's accessors costs.

- `copy_cost_ns`: one `get_generated_ids` call (a copy) against a read of the private list, at several lengths;
- `serve_interleaved`: streaming runs through each manager variant, interleaved, timing every `_pop_finished`
  (the one method the private-state manager and SchedulerManager differ in);
- `quiet_pop_us`: a pop alone, on finished requests, with no other thread running;
- `split_calls`: a server's calls split into those near the call's cost alone and the slower rest;
- `pop_account`: the back of the envelope, a number a row (the pop alone, in the server, as a share of a run);
- `plot_accessors`: the notebook's three panels.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable, Iterable
from typing import Any

from roseinfer.bench.stats import median
from roseinfer.bench.streaming import StreamingSetup, run_streaming
from roseinfer.sampling import SamplingParams

COLORS = {"private-state": "#7f7f7f", "current": "#d9534f"}


def _cost_at(engine, n: int, reps: int, repeat: int) -> dict[str, float]:
    scheduler = engine.new_scheduler()
    params = SamplingParams(max_new_tokens=1, stop_on_eos=False)
    rid = engine.add_request(scheduler, prompt_token_ids=[1], params=params)
    # A request n tokens in, set up and not measured: nothing is computed, so n may pass the model's context.
    scheduler._requests[rid].output_token_ids.extend(range(n))
    private = timeit.repeat(lambda: scheduler._requests[rid].output_token_ids, number=reps, repeat=repeat)
    accessor = timeit.repeat(lambda: scheduler.get_generated_ids(rid), number=reps, repeat=repeat)
    return {"private_ns": min(private) / reps * 1e9, "accessor_ns": min(accessor) / reps * 1e9}


def copy_cost_ns(engine, lengths: Iterable[int], reps: int = 20000, repeat: int = 5) -> dict[int, dict[str, float]]:
    """{n: {"private_ns", "accessor_ns"}}: ns a call, best of `repeat` timings of `reps` calls, n tokens in.

    The request is only queued, never scheduled: it holds no KV blocks, and nothing is left to free."""
    return {n: _cost_at(engine, n, reps, repeat) for n in lengths}


def timed_pop_finished(sink: list[float]) -> Callable[[Any], None]:
    """A `run_streaming` manager hook: every `_pop_finished` call timed with perf_counter, seconds into `sink`."""

    def hook(manager) -> None:
        pop = manager._pop_finished

        def timed(request_id):
            start = time.perf_counter()
            try:
                return pop(request_id)
            finally:
                sink.append(time.perf_counter() - start)

        manager._pop_finished = timed

    return hook


def serve_interleaved(engine, variants: Iterable[str], setup: StreamingSetup, repeats: int):
    """`repeats` streaming runs of each manager variant, interleaved; returns (runs, pop_calls_us).

    runs[variant]: a dict a run (tok_s, duration_s, pop_us_per_request, pop_total_ms, pop_median_us);
    pop_calls_us[variant]: every timed `_pop_finished` call of every run, in microseconds (one a request)."""
    variants = list(variants)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    pop_calls_us: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:  # interleaved: a drift of the machine's speed hits both alike
            pops: list[float] = []
            metrics, _ = run_streaming(engine, variant, setup, manager_hook=timed_pop_finished(pops))
            runs[variant].append({"tok_s": metrics["output_throughput_tok_s"], "duration_s": metrics["duration_s"],
                                  "pop_us_per_request": sum(pops) / len(pops) * 1e6, "pop_total_ms": sum(pops) * 1e3,
                                  "pop_median_us": median(pops) * 1e6})
            pop_calls_us[variant] += [x * 1e6 for x in pops]
    return runs, pop_calls_us


def quiet_pop_us(engine, pop: Callable[[Any, int], Any], prompt: str, new_tokens: int, count: int) -> float:
    """Median microseconds of `pop(scheduler, rid)` over `count` finished requests, in this thread alone."""
    scheduler = engine.new_scheduler()
    params = SamplingParams(max_new_tokens=new_tokens, stop_on_eos=False)
    ids = [engine.add_request(scheduler, prompt=prompt, params=params) for _ in range(count)]
    while scheduler.has_unfinished():
        engine.step(scheduler)
    times = []
    for rid in ids:
        start = time.perf_counter()
        pop(scheduler, rid)
        times.append(time.perf_counter() - start)
    return median(times) * 1e6


def split_calls(calls: list[float], alone: float, factor: float = 1.5) -> tuple[list[float], list[float]]:
    """(the calls within `factor` x the call's cost alone, the slower rest)."""
    return [x for x in calls if x <= factor * alone], [x for x in calls if x > factor * alone]


def pop_account(quiet_pop: dict[str, float], pop_calls_us: dict[str, list[float]],
                runs: dict[str, list[dict[str, float]]], requests: int, factor: float = 1.5) -> dict[str, float]:
    """Notebook 06's back of the envelope, for the variants "private-state" and "current" (pop_response):

    alone_*_us: the pop's median alone (`quiet_pop_us`); extra_us: what pop_response adds to it;
    server_over_alone_*: the server's median call (median of the runs' medians) over the call's cost alone;
    near_alone_share: the share of pop_response's calls in the server within `factor` x its cost alone;
    run_ms: a run's median length; share_of_run: extra_us x `requests`, over run_ms (the extra work, measured alone);
    worst_share: the largest, over paired runs, of the time the server spent in pop_response beyond the private
    pop's, over the run's length (the server's own figures)."""
    private, accessor = quiet_pop["private-state"], quiet_pop["current"]
    extra = accessor - private
    fast, slow = split_calls(pop_calls_us["current"], accessor, factor)
    server = {v: median([r["pop_median_us"] for r in runs[v]]) for v in ("private-state", "current")}
    run_ms = median([r["duration_s"] for r in runs["current"]]) * 1000
    worst = max((r["pop_total_ms"] - s["pop_total_ms"]) / (r["duration_s"] * 1000)
                for r, s in zip(runs["current"], runs["private-state"]))
    return {"alone_private_us": private, "alone_accessor_us": accessor, "extra_us": extra,
            "server_over_alone_private": server["private-state"] / private,
            "server_over_alone_accessor": server["current"] / accessor,
            "near_alone_share": len(fast) / max(1, len(fast) + len(slow)),
            "run_ms": run_ms, "share_of_run": extra * requests / 1000 / run_ms, "worst_share": worst}


def plot_accessors(cost, pop_calls_us, alone_us: float, runs, names: dict[str, str], throughput_title: str):
    """Three panels: a read against a copy by length; every pop call in the server; each run's tok/s."""
    from roseinfer.bench import plots

    fig, (ax1, ax2, ax3) = plots.figure(3, width=14 / 3, height=3.8)
    lengths = list(cost)
    for key, v, label in (("private_ns", "private-state", "private reference (no copy)"),
                          ("accessor_ns", "current", "get_generated_ids (a copy)")):
        ax1.plot(lengths, [cost[n][key] for n in lengths], "o-", color=COLORS[v], label=label)
    ax1.set(xscale="log", yscale="log", xlabel="tokens in the request", ylabel="ns per call (best of 5)",
            title="reading a request's ids")
    plots.plain_log_axis(ax1.xaxis)  # plain numbers (600, not 6x10^2) on both log axes
    plots.plain_log_axis(ax1.yaxis)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    for i, v in enumerate(names):  # every call of every run: the calls split into fast and slow ones
        calls = pop_calls_us[v]
        ax2.bar(i, median(calls), color=COLORS[v], alpha=0.35, width=0.6)
        ax2.plot([i + 0.25 * ((k % 9) / 8 - 0.5) for k in range(len(calls))], calls, "o", color=COLORS[v], ms=2.5,
                 alpha=0.6)
    ax2.axhline(alone_us, color=COLORS["current"], ls="--", lw=1, label="pop_response alone (median)")
    ax2.set(yscale="log", ylabel="us per call (every call; bar: median)",
            title="taking a finished request out (in the server)")
    plots.plain_log_axis(ax2.yaxis)
    ax2.legend(fontsize=7)
    for i, v in enumerate(names):
        values = [r["tok_s"] for r in runs[v]]
        ax3.bar(i, median(values), color=COLORS[v], alpha=0.35, width=0.6)
        ax3.plot([i] * len(values), values, "o", color=COLORS[v], ms=4)
        ax3.annotate(f"{median(values):.4g}", (i + 0.32, median(values)), va="center", fontsize=9)
    ax3.set(xlim=(-0.5, len(names) - 0.2), ylabel="output tokens/s", title=throughput_title)
    for ax in (ax2, ax3):
        ax.set_xticks(range(len(names)), list(names.values()))
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
