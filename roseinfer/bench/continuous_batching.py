"""Notebook 03: static batching against continuous batching, on requests that arrive at wall-clock instants.

Both policies are schedulers over the same engine, served through one loop (`serve`): before each step the
loop hands the scheduler every request whose arrival instant has passed, then runs one step; when nothing is
left to run it sleeps until the next arrival. The only difference between the two runs is the scheduler class
(`StaticBatchScheduler` from roseinfer.history against today's `OnlineScheduler`), so what is measured is the
scheduler's change alone.

A request's queue wait runs from its arrival instant to the start of the step that admits it, and its TTFT from
its arrival instant to its first token: a request that arrives while a step runs waits out that step too.

- `serve`, `capacity_req_s`, `measure`: the runs;
- `summarize` -> `Summary`: the verdicts, the small table the notebook prints, the directions it asserts and the
  metrics it saves;
- `envelope`: the back-of-the-envelope figures beside the measured ones;
- `plot_runs`: the figure.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from roseinfer.bench.batching import StepClock, StepRecord
from roseinfer.bench.stats import Verdict, median, verdict
from roseinfer.bench.workloads import BenchRequest
from roseinfer.engine.scheduler import OnlineScheduler
from roseinfer.history.static_scheduler import StaticBatchScheduler
from roseinfer.sampling import SamplingParams

SCHEDULERS: dict[str, type[OnlineScheduler]] = {"static": StaticBatchScheduler, "continuous": OnlineScheduler}


@dataclass
class TimedRun:
    """One run of requests arriving at wall-clock instants; every time in seconds since the run began."""

    arrival_s: list[float]  # per request, its arrival instant (the workload's schedule)
    start_s: list[float]  # the start of the step that admitted it
    first_token_s: list[float]
    finish_s: list[float]  # when its last token was produced
    token_ids: list[list[int]]
    steps: list[StepRecord]  # every forward step, as runner.execute ran it
    wall_s: float  # the whole loop
    idle_s: float  # of which asleep, nothing to run until the next arrival

    @property
    def queue_wait_ms(self) -> list[float]:
        return [(s - a) * 1000 for s, a in zip(self.start_s, self.arrival_s)]

    @property
    def ttft_ms(self) -> list[float]:
        return [(f - a) * 1000 for f, a in zip(self.first_token_s, self.arrival_s)]

    @property
    def wasted_fraction(self) -> float:
        """Share of the sampled rows whose token nobody kept (their request had finished)."""
        sampled = sum(s.sampled for s in self.steps)
        return 1 - sum(map(len, self.token_ids)) / sampled if sampled else 0.0

    @property
    def model_s(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def output_tok_s(self) -> float:
        """Tokens over the time inside the model's steps (the sleeps between arrivals are not the engine's)."""
        return sum(map(len, self.token_ids)) / self.model_s

    @property
    def bookkeeping_fraction(self) -> float:
        """Share of the loop's busy time spent outside the model (scheduling, admission, outputs)."""
        return 1 - self.model_s / (self.wall_s - self.idle_s)

    def live_rows(self) -> list[int]:
        """Per step, the rows that belonged to a request not yet finished."""
        return [sum(b <= s.start_s and f >= s.end_s for b, f in zip(self.start_s, self.finish_s)) for s in self.steps]

    def waiting(self) -> list[int]:
        """Per step, the requests that had arrived and not started when it began."""
        return [sum(a <= s.start_s < b for a, b in zip(self.arrival_s, self.start_s)) for s in self.steps]


def _params(requests: list[BenchRequest]) -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in requests]


def serve(
    engine, scheduler_class: type[OnlineScheduler], requests: list[BenchRequest], arrival_s: list[float],
    batch_size: int,
) -> TimedRun:
    """Serve `requests` (in arrival order) as a server loop does: before each step, admit what has arrived."""
    n, params = len(requests), _params(requests)
    # A token budget that fits a whole batch of prompts: a static batch is prefilled in one step, as in notebook 02.
    budget = batch_size * max(len(r.prompt_token_ids) for r in requests)
    scheduler = engine.new_scheduler(
        scheduler_class, max_batch_size=batch_size, max_num_batched_tokens=budget, enable_prefix_cache=False
    )
    rids: list[int] = []
    idle = 0.0
    with StepClock(engine.runner) as clock:
        while len(rids) < n or scheduler.has_unfinished():
            now = time.perf_counter() - clock.t0
            while len(rids) < n and arrival_s[len(rids)] <= now:
                i = len(rids)
                rids.append(engine.add_request(scheduler, prompt_token_ids=requests[i].prompt_token_ids,
                                               params=params[i]))
            if scheduler.has_unfinished():
                ran = len(clock.steps)
                engine.step(scheduler)
                if len(clock.steps) == ran:
                    raise RuntimeError("the scheduler ran no step with requests unfinished (KV pool too small?)")
            elif len(rids) < n:
                time.sleep(max(0.0, arrival_s[len(rids)] - now))
                idle += time.perf_counter() - clock.t0 - now
        wall = time.perf_counter() - clock.t0
    assert scheduler.kv_stats()["num_preemptions"] == 0, "a preempted padding row would be generated again"
    outs = [scheduler.pop_response(r) for r in rids]
    m, t0 = [o.metrics for o in outs], clock.t0
    return TimedRun(
        list(arrival_s),
        [x.first_scheduled_time - t0 for x in m],
        [x.first_token_time - t0 for x in m],
        [x.finish_time - t0 for x in m],
        [o.token_ids for o in outs],
        clock.steps,
        wall,
        idle,
    )


def capacity_req_s(engine, requests: list[BenchRequest], batch_size: int) -> float:
    """Requests per second continuous batching serves flat out: all of them arriving at once (after a warm-up)."""
    serve(engine, OnlineScheduler, requests[:2], [0.0, 0.0], batch_size)
    run = serve(engine, OnlineScheduler, requests, [0.0] * len(requests), batch_size)
    return len(requests) / run.wall_s


def measure(
    engine, requests: list[BenchRequest], arrival_s: list[float], batch_size: int, repeats: int
) -> dict[str, list[TimedRun]]:
    """Both schedulers, interleaved run after run on the same arrivals; asserts identical greedy tokens."""
    runs: dict[str, list[TimedRun]] = {name: [] for name in SCHEDULERS}
    for _ in range(repeats):
        for name, cls in SCHEDULERS.items():
            runs[name].append(serve(engine, cls, requests, arrival_s, batch_size))
        assert runs["static"][-1].token_ids == runs["continuous"][-1].token_ids, "the schedulers disagree on tokens"
    return runs


def _p50(runs: list[TimedRun], metric: str) -> list[float]:
    return [median(getattr(r, metric)) for r in runs]


def _short(v: Verdict, better: str, worse: str) -> str:
    """The verdict column: '1.23x more (95% CI 1.05-1.49x), p = 0.0079' or 'no difference shown, p = 0.31'."""
    if not v.significant:
        return f"no difference shown, p = {v.p_value:.2g}"
    lo, hi = v.interval
    if v.ratio >= 1:
        return f"{v.ratio:.2f}x {better} (95% CI {lo:.2f}-{hi:.2f}x), p = {v.p_value:.2g}"
    return f"{1 / v.ratio:.2f}x {worse} (95% CI {1 / hi:.2f}-{1 / lo:.2f}x), p = {v.p_value:.2g}"


@dataclass
class Summary:
    """What the runs say: per-run figures for each scheduler, and the verdicts on them."""

    wait: Verdict  # queue wait p50, ms
    ttft: Verdict  # TTFT p50, ms
    tok_s: Verdict  # output tokens per second of model time
    wasted_pct: dict[str, list[float]]
    bookkeeping_pct: dict[str, list[float]]
    steps: dict[str, list[int]]

    def __str__(self) -> str:
        rows = [
            ("queue wait p50, ms", self.wait, _short(self.wait, "shorter", "longer")),
            ("TTFT p50, ms", self.ttft, _short(self.ttft, "shorter", "longer")),
            ("output tok/s, model time", self.tok_s, _short(self.tok_s, "more", "fewer")),
            ("rows thrown away, %", self.wasted_pct, ""),
            ("bookkeeping, % of busy time", self.bookkeeping_pct, ""),
            ("forward steps", self.steps, ""),
        ]
        n = len(self.wait.before)
        lines = [f"{f'medians of {n} runs':<28} {'static':>9} {'continuous':>11}   continuous against static"]
        for label, data, said in rows:
            before, after = (data.before, data.after) if isinstance(data, Verdict) else (data["static"],
                                                                                          data["continuous"])
            b, a = median(list(before)), median(list(after))
            lines.append(f"{label:<28} {b:>9.4g} {a:>11.4g}   {said}".rstrip())
        return "\n".join(lines)

    def assert_directions(self, lengths_differ: bool = True, max_bookkeeping_pct: float | None = None) -> None:
        """What the notebook's prose says; a rerun that contradicts it fails here."""
        assert self.wait.better, "continuous batching should start arriving requests sooner"
        assert self.ttft.better and self.ttft.ratio > 2, "first tokens should come several times sooner"
        assert not self.tok_s.worse, "continuous batching should not produce tokens more slowly"
        assert median(self.steps["continuous"]) < median(self.steps["static"]), "the same tokens in fewer steps"
        assert max(self.wasted_pct["continuous"]) == 0, "continuous batching computes no row of a finished request"
        assert min(self.wasted_pct["static"]) > 0 or not lengths_differ, "a static batch pads unequal lengths"
        if max_bookkeeping_pct is not None:
            assert median(self.bookkeeping_pct["continuous"]) < max_bookkeeping_pct, "bookkeeping should stay small"

    def metrics(self) -> dict[str, object]:
        """The saved result's metrics (the README's headline reads the queue waits, wasted rows and tok/s)."""
        return {
            "before_queue_wait_p50_ms": list(self.wait.before), "after_queue_wait_p50_ms": list(self.wait.after),
            "before_ttft_p50_ms": list(self.ttft.before), "after_ttft_p50_ms": list(self.ttft.after),
            "before_runs_tok_s": list(self.tok_s.before), "after_runs_tok_s": list(self.tok_s.after),
            "before_wasted_pct_runs": self.wasted_pct["static"], "after_wasted_pct_runs": self.wasted_pct["continuous"],
            "wasted_fraction": median(self.wasted_pct["static"]) / 100,
            "continuous_wasted_fraction": median(self.wasted_pct["continuous"]) / 100,
            "before_bookkeeping_pct_runs": self.bookkeeping_pct["static"],
            "after_bookkeeping_pct_runs": self.bookkeeping_pct["continuous"],
            "static_steps": self.steps["static"], "continuous_steps": self.steps["continuous"],
            "speedup": self.tok_s.ratio,
        }


def summarize(runs: Mapping[str, list[TimedRun]]) -> Summary:
    s, c = runs["static"], runs["continuous"]
    return Summary(
        wait=verdict("queue wait p50", _p50(s, "queue_wait_ms"), _p50(c, "queue_wait_ms"), "ms", False),
        ttft=verdict("TTFT p50", _p50(s, "ttft_ms"), _p50(c, "ttft_ms"), "ms", False),
        tok_s=verdict("output tok/s", [r.output_tok_s for r in s], [r.output_tok_s for r in c], "tok/s", True),
        wasted_pct={n: [100 * r.wasted_fraction for r in runs[n]] for n in runs},
        bookkeeping_pct={n: [100 * r.bookkeeping_fraction for r in runs[n]] for n in runs},
        steps={n: [len(r.steps) for r in runs[n]] for n in runs},
    )


@dataclass
class Envelope:
    """Back-of-the-envelope figures beside the measured ones (medians over runs)."""

    predicted_wait_ms: float  # continuous: the rest of the step in progress, for an arrival at a random instant
    measured_wait_ms: float  # continuous: mean queue wait
    median_step_ms: float  # continuous: a step's median duration
    predicted_wasted_pct: float  # static: groups of batch_size in arrival order, each run to its longest
    measured_wasted_pct: float

    def __str__(self) -> str:
        return (
            f"continuous, mean queue wait: predicted {self.predicted_wait_ms:.1f} ms (the rest of the step in "
            f"progress), measured {self.measured_wait_ms:.1f} ms; a step's median {self.median_step_ms:.1f} ms\n"
            f"static, rows thrown away: predicted {self.predicted_wasted_pct:.0f}% (groups in arrival order), "
            f"measured {self.measured_wasted_pct:.0f}%"
        )


def residual_wait_s(run: TimedRun) -> float:
    """Mean wait, for an arrival at a uniformly random instant between the first arrival and the last, for the
    step then in progress to end: inside a step [a, b] an arrival at x waits b - x (idle: it waits nothing)."""
    window = max(run.arrival_s)
    waits = 0.0
    for s in run.steps:
        end = min(s.end_s, window)
        if end > s.start_s:
            waits += (s.end_s - s.start_s) ** 2 / 2 - (s.end_s - end) ** 2 / 2  # the integral of b - x over [a, end]
    return waits / window if window > 0 else 0.0


def padded_waste(lengths: list[int], batch_size: int) -> float:
    """Share of decode rows a static batch throws away when requests are grouped in order, each group run to
    its longest: a group of lengths n_1..n_B samples B * max(n) rows for sum(n) tokens."""
    groups = [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    return 1 - sum(lengths) / sum(len(g) * max(g) for g in groups)


def envelope(runs: Mapping[str, list[TimedRun]], lengths: list[int], batch_size: int) -> Envelope:
    c = runs["continuous"]
    return Envelope(
        predicted_wait_ms=median([1000 * residual_wait_s(r) for r in c]),
        measured_wait_ms=median([sum(r.queue_wait_ms) / len(r.queue_wait_ms) for r in c]),
        median_step_ms=median([1000 * median([s.seconds for s in r.steps]) for r in c]),
        predicted_wasted_pct=100 * padded_waste(lengths, batch_size),
        measured_wasted_pct=median([100 * r.wasted_fraction for r in runs["static"]]),
    )


def _stairs(steps: list[StepRecord], values: list[int]) -> tuple[list[float], list[int]]:
    """A step plot's points: each value from its step's start, dropping to 0 where the engine idled after it."""
    xs, ys = [], []
    for k, (s, v) in enumerate(zip(steps, values)):
        xs.append(s.start_s)
        ys.append(v)
        if k + 1 == len(steps) or steps[k + 1].start_s - s.end_s > 1e-3:
            xs.append(s.end_s)
            ys.append(0)
    return xs, ys


def plot_runs(runs: Mapping[str, list[TimedRun]], batch_size: int, title: str):
    """Queue wait and TTFT per run (bars: median, whiskers: min-max), and one run of each policy step by step."""
    from roseinfer.bench import plots

    names = list(runs)
    fig, axes = plots.figure(4, width=3.6, height=3.2)
    plots.before_after_bars(axes[0], names, [_p50(runs[n], "queue_wait_ms") for n in names], "ms", "queue wait p50")
    plots.before_after_bars(axes[1], names, [_p50(runs[n], "ttft_ms") for n in names], "ms", "TTFT p50")
    for ax, name in zip(axes[2:], names):
        r = runs[name][-1]
        ax.step(*_stairs(r.steps, [s.rows for s in r.steps]), where="post", color="#b0b0b0", label="rows computed")
        ax.step(*_stairs(r.steps, r.live_rows()), where="post", color="#d9534f", label="rows of live requests")
        ax.step(*_stairs(r.steps, r.waiting()), where="post", color="#5b8bd0", ls="--", label="requests waiting")
        ax.set_title(f"{name}: one run, step by step", fontsize=9)
        ax.set_xlabel("time (s)")
        ax.set_ylim(0, max(batch_size, *r.waiting()) + 1)
        ax.grid(alpha=0.3)
    axes[3].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return fig
