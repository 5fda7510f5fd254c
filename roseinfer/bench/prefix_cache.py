"""Notebook 10's measurements: TTFT without and with the prefix cache, a request alone and under a stream.

- `one_after_another`: each request alone, after the previous one: its greedy tokens, the prompt tokens it computed;
- `alone_and_capacity`: a hit's TTFT beside a full prefill's, and the no-cache server's rate on a burst;
- `stream_runs`: the workload arriving at Poisson rates, the variants interleaved, one list of runs per load;
- `stream_verdicts`: the runs compared, a rank test over runs (a run's requests queue behind each other, so they
  are not independent draws); `request_table`: every request of every run pooled; `stream_record`: what results/ keeps;
- `hit_envelope` / `envelope_table`: the FLOPs a hit skips, and the floor under what it still does;
- `plot_prefix_cache`: the notebook's figure;
- `SIZES`: the notebook's parameters, `notebook.sizes(**SIZES)`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from roseinfer.bench.metrics import percentile
from roseinfer.bench.roofline import prefill_cost, step_cost
from roseinfer.bench.scheduler_modes import SchedulerSetup, run_mode
from roseinfer.bench.stats import Verdict, verdict
from roseinfer.sampling import SamplingParams

# loads: Poisson rates as fractions of the lone-prefill rate (1 / a lone no-cache prefill, measured in the notebook);
# repeats: rounds of the lone-request timing; stream_runs: runs of the stream per variant and load.
SIZES = dict(
    cpu=dict(model="gpt2", num_requests=12, prefix_len=128, suffix_len=16, output_len=8, num_prefixes=2,
             loads=[0.5, 0.9], headline_load=0.5, repeats=5, stream_runs=7),
    gpu=dict(model="gpt2", num_requests=64, prefix_len=768, suffix_len=32, output_len=32, num_prefixes=4,
             loads=[0.25, 0.5, 0.75, 0.9], headline_load=0.5, repeats=5, stream_runs=5),
    ci=dict(model="gpt2-tiny", num_requests=4, prefix_len=32, suffix_len=4, output_len=2, num_prefixes=1,
            loads=[0.5, 0.9], repeats=2, stream_runs=2),
)


def one_after_another(engine, workload, params, scheduler_class) -> tuple[list[list[int]], list[int]]:
    """Each request alone, after the previous one finished: its greedy tokens and the prompt tokens it computed."""
    engine.block_manager.reset_prefix_cache()
    scheduler = engine.new_scheduler(scheduler_class, enable_prefix_cache=True)
    tokens, computed = [], []
    for r, p in zip(workload, params):
        rid = engine.add_request(scheduler, prompt_token_ids=r.prompt_token_ids, params=p)
        while scheduler.has_unfinished():
            engine.step(scheduler)
        out = scheduler.pop_response(rid)
        tokens.append(out.token_ids)
        computed.append(len(r.prompt_token_ids) - out.metrics.num_cached_tokens)
    return tokens, computed


def alone_and_capacity(engine, variants: Mapping[str, type], workload, params, num_prefixes: int,
                       repeats: int) -> tuple[dict[str, list[float]], list[float]]:
    """(TTFT ms of a request alone whose prefix was computed just before it, per variant; requests/s the first
    variant completes with the whole workload queued at once), `repeats` interleaved rounds."""
    pair = [workload[0], workload[num_prefixes]]  # the second shares the first's prefix
    first_token_only = [SamplingParams(max_new_tokens=1, stop_on_eos=False)] * 2
    alone: dict[str, list[float]] = {name: [] for name in variants}
    burst: list[float] = []
    for _ in range(repeats):
        for name, cls in variants.items():
            m = run_mode(engine, SchedulerSetup(scheduler_class=cls), "naive", pair, first_token_only)
            alone[name].append(m["ttfts_ms"][1])
        m = run_mode(engine, SchedulerSetup(scheduler_class=next(iter(variants.values()))), "offline", workload, params)
        burst.append(len(workload) / m["total_time_s"])
    return alone, burst


def stream_runs(engine, variants: Mapping[str, type], workload, params, loads: Sequence[float], rate: float,
                repeats: int, stall_ms: float | None = None) -> tuple[dict[str, dict[float, list]], list[tuple]]:
    """run_mode "online" metrics per variant and load (load x `rate` requests/s), runs interleaved; run `rep` draws
    its Poisson gaps from seed `rep`, the same for both variants. A run whose first request (nothing ahead of
    it) took over `stall_ms` is a machine stall: it is run again (up to twice) and listed in the second value."""
    runs: dict[str, dict[float, list]] = {name: {f: [] for f in loads} for name in variants}
    stalled = []
    for rep in range(repeats):
        for f in loads:
            for name, cls in variants.items():
                setup = SchedulerSetup(scheduler_class=cls, request_rate=f * rate, seed=rep)
                for _ in range(3):
                    m = run_mode(engine, setup, "online", workload, params)
                    if stall_ms is None or m["ttfts_ms"][0] < stall_ms:
                        break
                    stalled.append((name, f, rep, m["ttfts_ms"][0]))
                runs[name][f].append(m)
    return runs, stalled


def run_p50s(runs: Mapping[str, Mapping[float, list]]) -> dict[str, dict[float, list[float]]]:
    """Each run's TTFT p50 (ms), per variant and load."""
    return {name: {f: [m["ttft_ms"]["p50"] for m in ms] for f, ms in by_load.items()} for name, by_load in runs.items()}


def stream_verdicts(p50s: Mapping[str, Mapping[float, list[float]]], rate: float,
                    capacity: float) -> dict[float, Verdict]:
    """Per load, the first variant's run p50s against the second's (lower is better)."""
    before, after = list(p50s)
    return {f: verdict(f"TTFT p50 at {f:g}x ({f * rate:.1f} req/s, {f * rate / capacity:.2f} of capacity)",
                       p50s[before][f], p50s[after][f], "ms", higher_is_better=False, labels=(before, after))
            for f in p50s[before]}


def request_summary(ms: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Every request of the given runs pooled: their count, TTFT p50/p90, and hits' and misses' TTFT p50."""
    pairs = [(t, c) for m in ms for t, c in zip(m["ttfts_ms"], m["cached_tokens"])]
    hits = [t for t, c in pairs if c > 0]
    return {"requests": len(pairs), "p50": percentile([t for t, _ in pairs], 50),
            "p90": percentile([t for t, _ in pairs], 90), "hits": len(hits), "hit_p50": percentile(hits, 50),
            "miss_p50": percentile([t for t, c in pairs if c == 0], 50)}


def request_table(runs: Mapping[str, Mapping[float, list]]) -> str:
    """Per load and variant, every request of every run pooled (TTFT ms; "-" where there is none)."""
    def ms(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.0f}"

    lines = [f"{'load':>5} {'variant':>15} {'requests':>8} {'pooled p50':>10} {'pooled p90':>10} {'hits':>5} "
             f"{'hit p50':>8} {'miss p50':>8}"]
    for f in next(iter(runs.values())):
        for name, by_load in runs.items():
            s = request_summary(by_load[f])
            lines.append(f"{f:>4g}x {name[:15]:>15} {s['requests']:>8} {ms(s['p50']):>10} {ms(s['p90']):>10} "
                         f"{s['hits']:>5} {ms(s['hit_p50']):>8} {ms(s['miss_p50']):>8}")
    return "\n".join(lines)


def stream_record(runs: Mapping[str, Mapping[float, list]]) -> dict[str, dict[str, dict[str, list]]]:
    """What results/ keeps of the stream: per variant and load ("0.5"), each run's TTFT p50, hit rate, and its
    requests' cached tokens and TTFTs."""
    return {name: {f"{f:g}": {"ttft_p50_ms": [m["ttft_ms"]["p50"] for m in ms],
                              "hit_rate": [m["kv"]["prefix_cache_hit_rate"] for m in ms],
                              "cached_tokens": [m["cached_tokens"] for m in ms],
                              "ttfts_ms": [m["ttfts_ms"] for m in ms]} for f, ms in by_load.items()}
            for name, by_load in runs.items()}


def hit_envelope(cfg, prompt_len: int, cached: int, t_full_ms: float, t_hit_ms: float, peaks: Mapping[str, float],
                 elem_bytes: int = 4) -> dict[str, Any]:
    """A hit against a full prefill of `prompt_len` tokens, `cached` of them from the cache: FLOPs it skips,
    the time they took at the full prefill's measured rate, and the floor under the hit's own step."""
    full = prefill_cost(cfg, [prompt_len], elem_bytes)
    hit = step_cost(cfg, prompt_len - cached, sum(range(cached + 1, prompt_len + 1)), 1, elem_bytes, cached)
    achieved = full.flops / (t_full_ms / 1000)  # FLOP/s the full prefill reached
    skipped = full.flops - hit.flops
    return {"full_gflop": full.flops / 1e9, "skipped_gflop": skipped / 1e9, "hit_gflop": hit.flops / 1e9,
            "hit_mb": hit.bytes / 1e6, "full_gflop_s": achieved / 1e9, "predicted_saving_ms": 1000 * skipped / achieved,
            "saving_ms": t_full_ms - t_hit_ms, "t_full_ms": t_full_ms, "t_hit_ms": t_hit_ms,
            "hit_floor_ms": 1000 * hit.floor_s(peaks), "hit_bound": hit.bound(peaks),
            "hit_gflop_s": hit.flops / (t_hit_ms / 1000) / 1e9, "matmul_gflop_s": peaks["matmul_flops"] / 1e9}


def envelope_table(e: Mapping[str, Any]) -> str:
    """`hit_envelope`'s figures, predicted beside measured (ms)."""
    rows = [("", "predicted", "measured"),
            (f"full prefill, {e['full_gflop']:.1f} GFLOP", "",
             f"{e['t_full_ms']:.0f} ({e['full_gflop_s']:.0f} GFLOP/s)"),
            (f"a hit skips {e['skipped_gflop']:.1f} GFLOP ({e['skipped_gflop'] / e['full_gflop']:.0%})",
             f"{e['predicted_saving_ms']:.0f} saved",
             f"{e['saving_ms']:.0f} saved"),
            (f"a hit does {e['hit_gflop']:.2f} GFLOP, {e['hit_mb']:.0f} MB",
             f"floor {e['hit_floor_ms']:.1f} ({e['hit_bound']})",
             f"{e['t_hit_ms']:.1f} ({e['hit_gflop_s']:.0f} GFLOP/s)")]
    return "\n".join(f"{a:<36} {b:>16} {c:>22}" for a, b, c in rows)


def plot_prefix_cache(alone: Mapping[str, list[float]], p50s: Mapping[str, Mapping[float, list[float]]],
                      runs: Mapping[str, Mapping[float, list]], rate: float, capacity: float):
    """Three panels: a request alone; run p50s against the load; every request at the top load, pooled."""
    from roseinfer.bench import plots

    names = list(alone)
    loads = list(p50s[names[0]])
    fig, (ax1, ax2, ax3) = plots.figure(3, width=4.3)
    plots.before_after_bars(ax1, names, [alone[n] for n in names], "TTFT (ms)", "one request alone")
    ax1.tick_params(axis="x", labelsize=7)
    plots.curve(ax2, {n: (loads, [p50s[n][f] for f in loads]) for n in names},
                f"offered load (x the lone-prefill rate, {rate:.1f} req/s)", "TTFT p50 of a run (ms)",
                "runs under a Poisson stream", logy=True)
    ax2.axvline(capacity / rate, color="grey", ls=":", lw=1, label="no-cache capacity")
    ax2.set_xticks(loads)
    ax2.legend(fontsize=7)
    top = loads[-1]
    plots.latency_cdf(ax3, {n: [t for m in runs[n][top] for t in m["ttfts_ms"]] for n in names}, "TTFT (ms)",
                      f"every request at {top:g}x, all runs")
    ax3.set_xscale("log")
    plots.plain_log_axis(ax3.xaxis)
    ax3.legend(fontsize=7)
    return fig
