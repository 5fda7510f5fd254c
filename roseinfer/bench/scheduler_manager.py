"""Notebook 04's analysis: a global lock around each request against the scheduler manager.

- the manager measured is notebook 04's (roseinfer.history.first_manager.FirstManager, "first-manager"):
  today's SchedulerManager with the three refinements of notebooks 05-07 taken back out;
- `runs_of` / `med`: one metric over the repeated runs of a variant at a concurrency;
- `lock_staircase`: when each request's first token came, without a manager (the problem, reproduced);
- `read_numbers`: the verdicts, back-of-the-envelope figures and the small table the notebook prints,
  with `Numbers.check()` asserting every direction its prose states;
- `summary` (what notebook.save keeps; the README's headline reads its keys) and `plot_streams`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roseinfer.bench.stats import Verdict, median, verdict

BEFORE, AFTER = "no-manager", "first-manager"  # AFTER: roseinfer/history/first_manager.py


Results = dict[str, dict[int, list[dict[str, Any]]]]  # variant -> concurrency -> run_streaming's metrics, a run each


def runs_of(results: Results, variant: str, c: int, *path: str) -> list[float]:
    """One metric (a path into run_streaming's metrics, e.g. "ttft_ms", "p50") of every run, in run order."""
    values = []
    for m in results[variant][c]:
        for key in path:
            m = m[key]
        values.append(m)
    return values


def med(results: Results, variant: str, c: int, *path: str) -> float:
    return median(runs_of(results, variant, c, *path))


@dataclass
class Staircase:
    """One burst of c requests without a manager: when each got its first token, and how long its own stream ran."""

    first_token_ms: list[float]  # sorted
    stream_ms: list[float]  # first to last token, per request

    @property
    def gaps_ms(self) -> list[float]:
        return [b - a for a, b in zip(self.first_token_ms, self.first_token_ms[1:])]

    def __str__(self) -> str:
        row = lambda xs: " ".join(f"{x:6.0f}" for x in xs)  # noqa: E731
        return (f"first token of each request, sorted (ms): {row(self.first_token_ms)}\n"
                f"gap to the next one (ms):                        {row(self.gaps_ms)}\n"
                f"a request's own stream, first to last token: median {median(self.stream_ms):.0f} ms")

    def check(self) -> None:
        """What the notebook says of it: each request waits for the whole stream of the one before it."""
        assert median(self.gaps_ms) > 0.8 * median(self.stream_ms), "without a manager, requests should take turns"


def lock_staircase(engine, c: int, new_tokens: int) -> Staircase:
    """Serve c requests submitted at once without a manager; read each one's timings off its stream."""
    from roseinfer.bench.streaming import StreamingSetup, run_streaming

    streams = []

    def record_streams(manager) -> None:
        submit = manager.submit

        def submit_and_keep(*args, **kwargs):
            streams.append(submit(*args, **kwargs))
            return streams[-1]

        manager.submit = submit_and_keep

    setup = StreamingSetup(num_requests=c, prompt="Hello", pretok=True, max_new_tokens=new_tokens, stop_on_eos=False)
    run_streaming(engine, BEFORE, setup, manager_hook=record_streams)
    times = [s.timings for s in streams]
    return Staircase(sorted((t.token_times[0] - t.submit) * 1000 for t in times),
                     [(t.token_times[-1] - t.token_times[0]) * 1000 for t in times])


def _short(v: Verdict) -> str:
    """A verdict's ratio and rank test in a table cell."""
    if not v.significant:
        return f"no difference {len(v.before)} runs can show (p = {v.p_value:.2g})"
    shown, word = (v.ratio, "better") if v.ratio >= 1 else (1 / v.ratio, "worse")
    return f"{shown:.2f}x {word} (p = {v.p_value:.2g})"


@dataclass
class Numbers:
    """What notebook 04's runs say at one stream and at the most (c) streams: verdicts and back-of-envelope figures."""

    c: int
    rows: list[tuple[str, Verdict, str]]  # (what, verdict lock -> manager, unit)
    lock_growth: float  # the lock's throughput at c streams / at 1
    manager_growth: Verdict  # the manager's throughput, 1 -> c streams
    envelopes: list[tuple[str, float, float]]  # (what, predicted, measured)
    ttft_parts_ms: dict[str, float]  # the manager's mean TTFT at c streams, in stages
    one_stream_spread_ms: float  # the lock's TTFT p50 with one stream, slowest run minus fastest
    nap_ms: float

    def __str__(self) -> str:
        def num(x: float) -> str:
            return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"

        def cell(xs: list[float], unit: str) -> str:  # the median, then (min-max) of the runs
            return f"{num(median(xs))} ({num(min(xs))}-{num(max(xs))}) {unit}"

        lines = [f"{'median (min-max)':24}{'no manager':>25}{'manager':>25}"]
        for what, v, unit in self.rows:
            lines.append(f"{what:24}{cell(list(v.before), unit):>25}{cell(list(v.after), unit):>25}  {_short(v)}")
        lines.append(f"throughput, 1 -> {self.c} streams: no manager {self.lock_growth:.2f}x, manager "
                     f"{self.manager_growth.ratio:.2f}x (p = {self.manager_growth.p_value:.2g})")
        lines.append(f"\n{'back of the envelope':56}{'predicted':>10}{'measured':>10}")
        for what, predicted, measured in self.envelopes:
            digits = 2 if predicted < 10 else 0
            lines.append(f"{what:56}{predicted:>10.{digits}f}{measured:>10.{digits}f}")
        parts = dict(self.ttft_parts_ms)
        wait, first = parts.pop("queue_wait"), parts.pop("prefill_to_first_token")
        lines.append(f"the manager's mean TTFT at {self.c} streams: queue wait {wait:.1f} + first step {first:.1f} "
                     f"+ the rest {sum(parts.values()):.1f} ms")
        return "\n".join(lines)

    def check(self) -> None:
        """Assert every direction the notebook's prose states (skipped at tiny sizes, where timings mean nothing)."""
        verdicts = {what: v for what, v, _ in self.rows}
        assert verdicts[f"TTFT p50, {self.c} streams"].better, "the manager should cut TTFT at many streams"
        assert verdicts[f"throughput, {self.c} streams"].better, "the manager should raise throughput at many streams"
        assert verdicts[f"ITL p50, {self.c} streams"].worse, "a step of c rows should take longer than a lone step"
        assert self.manager_growth.better, "with the manager, throughput should grow with the streams (one batch)"
        assert self.lock_growth < 1.5, "without a manager, throughput should stay near one stream's"
        assert self.one_stream_spread_ms > self.nap_ms, "one stream's runs should spread wider than a nap"
        for what, predicted, measured in self.envelopes:
            assert 1 / 1.5 < measured / predicted < 1.5, f"{what}: {measured:.3g} measured, {predicted:.3g} predicted"


def read_numbers(results: Results, new_tokens: int, nap_ms: float) -> Numbers:
    """The lock against the manager at 1 and at the most streams, with three back-of-envelope predictions."""
    from roseinfer.bench.streaming import TTFT_PARTITION

    cs = sorted(results[BEFORE])
    c = cs[-1]
    names = ("no manager", "manager")

    def compare(what: str, k: int, path: tuple[str, ...], unit: str, higher_is_better: bool):
        v = verdict(what, runs_of(results, BEFORE, k, *path), runs_of(results, AFTER, k, *path), unit,
                    higher_is_better=higher_is_better, labels=names)
        return what, v, unit

    ttft, tput, itl = ("ttft_ms", "p50"), ("output_throughput_tok_s",), ("itl_ms", "p50")
    rows = [compare("TTFT p50, 1 stream", 1, ttft, "ms", False),
            compare(f"TTFT p50, {c} streams", c, ttft, "ms", False),
            compare("throughput, 1 stream", 1, tput, "tok/s", True),
            compare(f"throughput, {c} streams", c, tput, "tok/s", True),
            compare(f"ITL p50, {c} streams", c, itl, "ms", False)]
    growth = verdict("the manager's throughput", runs_of(results, AFTER, 1, *tput), runs_of(results, AFTER, c, *tput),
                     "tok/s", higher_is_better=True, labels=("1 stream", f"{c} streams"))
    e2e_one, ttft_one = med(results, BEFORE, 1, "e2e_latency_ms", "p50"), med(results, BEFORE, 1, *ttft)
    lone_step, batch_step = med(results, BEFORE, c, *itl), med(results, AFTER, c, *itl)
    envelopes = [
        (f"lock's TTFT p50, ms: ({c}-1)/2 x {e2e_one:.0f} (e2e, 1 stream) + {ttft_one:.0f}",
         (c - 1) / 2 * e2e_one + ttft_one, med(results, BEFORE, c, *ttft)),
        (f"manager's TTFT p50, ms: {nap_ms:.0f} (nap) + {batch_step:.1f} (a step of {c})",
         nap_ms + batch_step, med(results, AFTER, c, *ttft)),
        (f"throughput gain: {c} x {lone_step:.1f} (lone step) / {batch_step:.1f}",
         c * lone_step / batch_step, med(results, AFTER, c, *tput) / med(results, BEFORE, c, *tput)),
    ]
    parts = {stage: med(results, AFTER, c, f"{stage}_ms", "mean") for stage in TTFT_PARTITION}
    one = runs_of(results, BEFORE, 1, *ttft)
    return Numbers(c, rows, med(results, BEFORE, c, *tput) / med(results, BEFORE, 1, *tput), growth, envelopes, parts,
                   max(one) - min(one), nap_ms)


def summary(results: Results) -> dict[str, Any]:
    """What notebook.save keeps: medians per concurrency (the README's headline reads them) and every run."""
    cs = sorted(results[BEFORE])

    def medians(variant: str, *path: str) -> list[float]:
        return [med(results, variant, c, *path) for c in cs]

    return {"concurrency": cs,
            "before_ttft_p50_ms": medians(BEFORE, "ttft_ms", "p50"),
            "after_ttft_p50_ms": medians(AFTER, "ttft_ms", "p50"),
            "before_tok_s": medians(BEFORE, "output_throughput_tok_s"),
            "after_tok_s": medians(AFTER, "output_throughput_tok_s"),
            "runs": {v: {c: [{"ttft_p50_ms": m["ttft_ms"]["p50"], "tok_s": m["output_throughput_tok_s"],
                              "e2e_p50_ms": m["e2e_latency_ms"]["p50"], "itl_p50_ms": m["itl_ms"]["p50"],
                              "itl_p99_ms": m["itl_ms"]["p99"]} for m in results[v][c]] for c in cs}
                     for v in results}}


def plot_streams(results: Results, names: dict[str, str], reference: tuple[str, dict[str, Any]] | None = None):
    """TTFT p50 (log) and output throughput against concurrent streams, each run a dot, their spread a band."""
    from roseinfer.bench import plots

    cs = sorted(results[BEFORE])
    fig, (ax1, ax2) = plots.figure(2, width=5.0, height=3.8)
    for ax, path, ylabel, title, logy in ((ax1, ("ttft_ms", "p50"), "TTFT p50 (ms)", "time to first token", True),
                                          (ax2, ("output_throughput_tok_s",), "output tokens/s", "throughput", False)):
        series = {names[v]: (cs, [runs_of(results, v, c, *path) for c in cs]) for v in names}
        plots.curve(ax, series, "concurrent streams", ylabel, title, logx=True, logy=logy)
    if reference is not None:
        tag, r = reference
        ax2.plot(r["metrics"]["concurrency"], r["metrics"]["after_tok_s"], "r--", alpha=0.5, label=f"manager ({tag})")
        ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
