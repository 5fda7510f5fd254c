"""Notebook 02: one request at a time against a static batch, and why the batch is faster.

- `OneRequestGenerator` (roseinfer/history/one_request.py): the loop before batching, timed as "before";
- `run_once` / `measure`: each number of requests run both ways, interleaved, every forward step timed through
  `StepClock` (prefill and decode steps apart);
- `compare`: the notebook's verdicts (whole runs, decode steps, prefill; each variant from 1 request to B);
- `fit_step`: the batch's decode step fitted as t(B) = a + b·B, beside its back of the envelope (the weights'
  bytes at the read bandwidth, one row's FLOPs at the matmul peak); `StepFit.table()` prints both;
- `step_envelope`: each batch size's decode step beside the weights' read and the rows' arithmetic at the peaks;
- `wasted_fraction`: the decode rows a static batch computes for requests already done, from the lengths alone;
- `plot`, `metrics`: the notebook's figure and its saved result (keys the README renderer reads).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from roseinfer.bench.batching import StepClock
from roseinfer.bench.roofline import decode_step_cost
from roseinfer.bench.stats import Verdict, median, verdict
from roseinfer.bench.workloads import BenchRequest
from roseinfer.history.one_request import OneRequestGenerator
from roseinfer.history.static_batching import StaticBatchGenerator
from roseinfer.sampling import SamplingParams

VARIANTS = {"one": "one at a time", "batch": "static batch"}  # legend names


@dataclass
class Run:
    """One run of a set of requests, its forward steps timed."""

    tok_s: float  # output tokens over the whole run
    decode_tok_s: float  # tokens sampled in decode steps over those steps' time
    step_s: float  # the median decode step
    prefill_s: float  # the steps that carried prompt tokens
    prefill_share: float  # of the run's time


def _params(requests: Sequence[BenchRequest]) -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=r.max_new_tokens, stop_on_eos=False) for r in requests]


def run_once(engine, requests: Sequence[BenchRequest], variant: str) -> tuple[Run, list[list[int]]]:
    """The requests one at a time ("one") or as one static batch ("batch"): the run's timings and greedy tokens."""
    generator = OneRequestGenerator(engine) if variant == "one" else StaticBatchGenerator(engine, len(requests))
    with StepClock(engine.runner) as clock:
        start = time.perf_counter()
        stats = generator.generate([r.prompt_token_ids for r in requests], _params(requests))
        elapsed = time.perf_counter() - start
    decode = [s for s in clock.steps if not s.has_prompt] or clock.steps  # one-token requests: no decode step
    prefill_s = sum(s.seconds for s in clock.steps if s.has_prompt)
    run = Run(sum(map(len, stats.token_ids)) / elapsed, sum(s.sampled for s in decode) / sum(s.seconds for s in decode),
              median([s.seconds for s in decode]), prefill_s, prefill_s / elapsed)
    return run, stats.token_ids


def measure(
    engine, requests: Sequence[BenchRequest], batch_sizes: Sequence[int], repeats: int
) -> dict[str, dict[int, list[Run]]]:
    """{"one" | "batch": {B: [Run per repeat]}}: the first B requests, both ways. Every repeat runs each B once, its
    two variants back to back, which goes first alternating between repeats (a slow moment hits both alike)."""
    run_once(engine, requests[:2], "batch")  # warm-up
    runs: dict[str, dict[int, list[Run]]] = {v: {B: [] for B in batch_sizes} for v in VARIANTS}
    for rep in range(repeats):
        for B in batch_sizes:
            for variant in VARIANTS if rep % 2 == 0 else reversed(VARIANTS):
                runs[variant][B].append(run_once(engine, requests[:B], variant)[0])
    return runs


def _field(runs: Sequence[Run], name: str, scale: float = 1.0) -> list[float]:
    return [getattr(r, name) * scale for r in runs]


def compare(runs: Mapping[str, Mapping[int, Sequence[Run]]], small: int, large: int) -> dict[str, Verdict]:
    """The verdicts: at `large` requests, one at a time against the batch over whole runs, decode steps and the
    prefill; then each variant from `small` requests to `large` (the problem: one at a time stays flat)."""
    one, batch, labels = runs["one"], runs["batch"], tuple(VARIANTS.values())
    sizes = (f"{small} request" + "s" * (small > 1), f"{large} requests")
    return {
        "run": verdict(f"{large} requests, whole runs", _field(one[large], "tok_s"), _field(batch[large], "tok_s"),
                       "tok/s", True, labels),
        "decode": verdict(f"{large} requests, decode steps", _field(one[large], "decode_tok_s"),
                          _field(batch[large], "decode_tok_s"), "tok/s", True, labels),
        "prefill": verdict(f"{large} prompts' prefill", _field(one[large], "prefill_s", 1e3),
                           _field(batch[large], "prefill_s", 1e3), "ms", False, labels),
        "one": verdict("one at a time", _field(one[small], "tok_s"), _field(one[large], "tok_s"), "tok/s", True, sizes),
        "batch": verdict("static batch", _field(batch[small], "tok_s"), _field(batch[large], "tok_s"), "tok/s", True,
                         sizes),
    }


@dataclass
class StepFit:
    """t(B) = a + b·B fitted to the median decode step at each B, with 95% bootstrap intervals over the runs, and the
    back of the envelope of each part: a ~ the weights read once (`read_s`), b ~ one row's FLOPs at the peak (`row_s`)."""

    batch_sizes: list[int]
    measured_s: list[float]  # median decode step at each B
    a: float
    b: float
    a_range: tuple[float, float]
    b_range: tuple[float, float]
    weight_bytes: float
    read_bw: float  # bytes/s: the read bandwidth measured on this machine
    row_flops: float
    matmul_flops: float  # FLOP/s: the matmul peak measured on this machine

    @property
    def read_s(self) -> float:
        return self.weight_bytes / self.read_bw

    @property
    def row_s(self) -> float:
        return self.row_flops / self.matmul_flops

    @property
    def misfit_s(self) -> float:
        return max(abs(t - (self.a + self.b * B)) for B, t in zip(self.batch_sizes, self.measured_s))

    @property
    def resolved(self) -> bool:
        """Whether the data pins b down: its interval excludes zero and the line misses no measured step by more
        than it grows across the sizes."""
        return self.b_range[0] > 0 and self.misfit_s < self.b * (self.batch_sizes[-1] - self.batch_sizes[0])

    def table(self) -> str:
        ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
        lines = ["decode step t(B) = a + b·B, fitted to the static batch's median steps",
                 "B".ljust(16) + "".join(f"{B:>8}" for B in self.batch_sizes),
                 "measured, ms".ljust(16) + "".join(f"{ms(t):>8}" for t in self.measured_s),
                 "fit, ms".ljust(16) + "".join(f"{ms(self.a + self.b * B):>8}" for B in self.batch_sizes),
                 f"{'':16}{'fit (95% bootstrap)':<26}back of the envelope",
                 f"{'a, per step':16}{ms(self.a) + ' ms (' + ms(self.a_range[0]) + '-' + ms(self.a_range[1]) + ')':<26}"
                 f"{ms(self.read_s)} ms: {self.weight_bytes / 1e6:.0f} MB of weights at {self.read_bw / 1e9:.0f} GB/s",
                 f"{'b, per row':16}{ms(self.b) + ' ms (' + ms(self.b_range[0]) + '-' + ms(self.b_range[1]) + ')':<26}"
                 f"{ms(self.row_s)} ms: {self.row_flops / 1e9:.2f} GFLOP at {self.matmul_flops / 1e9:.0f} GFLOP/s"]
        if self.resolved:
            lines.append(f"{'a / b, rows':16}{self.a / self.b:<26.1f}{self.read_s / self.row_s:.1f}")
        else:
            lines.append(f"b not resolved: the line misses a step by up to {ms(self.misfit_s)} ms")
        return "\n".join(lines)


def fit_step(
    step_s: Mapping[int, Sequence[float]], config, elem_bytes: int, context: int, peaks: Mapping[str, float],
    resamples: int = 1000, seed: int = 0,
) -> StepFit:
    """Fit t(B) = a + b·B to the median of each B's decode steps (`step_s[B]`: one per run, seconds); the bootstrap
    resamples each B's runs and refits. `context`: a decode step's typical context, for the per-row bytes."""
    sizes = sorted(step_s)
    measured = [median(list(step_s[B])) for B in sizes]
    b, a = np.polyfit(sizes, measured, 1)
    rng = np.random.default_rng(seed)
    boot = np.array([np.polyfit(sizes, [np.median(rng.choice(step_s[B], len(step_s[B]))) for B in sizes], 1)
                     for _ in range(resamples)])
    b_lo, b_hi = np.percentile(boot[:, 0], [2.5, 97.5])
    a_lo, a_hi = np.percentile(boot[:, 1], [2.5, 97.5])
    one, two = (decode_step_cost(config, [context] * rows, elem_bytes) for rows in (1, 2))
    row_bytes = two.bytes - one.bytes  # a row's own K/V reads and activations
    return StepFit(sizes, measured, float(a), float(b), (float(a_lo), float(a_hi)), (float(b_lo), float(b_hi)),
                   one.bytes - row_bytes, peaks["mem_bytes_s"], two.flops - one.flops, peaks["matmul_flops"])


def step_envelope(fit: StepFit) -> str:
    """Each batch size's median decode step beside its two costs at this machine's peaks: reading the weights once
    (the same at every B) and the B rows' arithmetic; the step stays flat while the read is the larger."""
    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    lines = ["B (rows)".ljust(38) + "".join(f"{B:>7}" for B in fit.batch_sizes),
             "decode step, median ms".ljust(38) + "".join(f"{ms(t):>7}" for t in fit.measured_s),
             "  / the step of 1 row".ljust(38) + "".join(f"{t / fit.measured_s[0]:>7.2f}" for t in fit.measured_s),
             f"weights' read, ms ({fit.weight_bytes / 1e6:.0f} MB, {fit.read_bw / 1e9:.0f} GB/s)".ljust(38)
             + "".join(f"{ms(fit.read_s):>7}" for _ in fit.batch_sizes),
             f"rows' arithmetic, ms ({fit.matmul_flops / 1e9:.0f} GFLOP/s)".ljust(38)
             + "".join(f"{ms(B * fit.row_s):>7}" for B in fit.batch_sizes)]
    return "\n".join(lines)


def wasted_fraction(lengths: Sequence[int]) -> float:
    """Share of a static batch's decode rows that belong to requests already done. Step 0 is the prefill; the
    group runs until its longest (m tokens) is done, decode steps 1..m-1 each computing every row; a request of n
    tokens has its last token after step n-1, so its row is wasted in steps n..m-1."""
    m = max(lengths)
    return sum(m - n for n in lengths) / (len(lengths) * (m - 1)) if m > 1 else 0.0


def measured_waste(engine, requests: Sequence[BenchRequest]) -> float:
    """The same share, counted by `StaticBatchGenerator` running the requests as one batch."""
    return StaticBatchGenerator(engine, len(requests)).generate(
        [r.prompt_token_ids for r in requests], _params(requests)).wasted_fraction


def metrics(runs: Mapping[str, Mapping[int, Sequence[Run]]], batch_sizes: Sequence[int]) -> dict:
    """The saved result's metrics (benchmarks/harness/readme.py reads batch_sizes, before_tok_s, after_tok_s)."""
    out: dict = {"batch_sizes": list(batch_sizes)}
    for side, v in (("before", "one"), ("after", "batch")):
        def med(name: str, scale: float = 1.0, v: str = v) -> list[float]:
            return [median(_field(runs[v][B], name, scale)) for B in batch_sizes]

        out |= {f"{side}_tok_s": med("tok_s"), f"{side}_runs": {B: _field(runs[v][B], "tok_s") for B in batch_sizes},
                f"{side}_decode_tok_s": med("decode_tok_s"), f"{side}_decode_step_ms": med("step_s", 1e3),
                f"{side}_prefill_s": med("prefill_s"), f"{side}_prefill_share": med("prefill_share")}
    return out


def plot(runs: Mapping[str, Mapping[int, Sequence[Run]]], batch_sizes: Sequence[int], title: str, ref=None):
    """Throughput, and the decode step's time, against the number of requests; `ref`: (tag, result) of a committed
    GPU run (`notebook.reference`), drawn dashed."""
    from roseinfer.bench import plots

    fig, (ax, ax_step) = plots.figure(2, width=5.5)
    plots.curve(ax, {name: (batch_sizes, [_field(runs[v][B], "tok_s") for B in batch_sizes])
                     for v, name in VARIANTS.items()}, "requests", "output tokens/s", title, logx=True)
    if ref:
        tag, result = ref
        m = result["metrics"]
        ax.plot(m["batch_sizes"], m["after_tok_s"], "r--", alpha=0.5, label=f"static batch ({tag})")
        ax.legend()
    plots.curve(ax_step, {name: (batch_sizes, [_field(runs[v][B], "step_s", 1e3) for B in batch_sizes])
                          for v, name in VARIANTS.items()},
                "requests", "ms per decode step (median of a run)", "one decode step: one row, or B rows", logx=True)
    ax_step.set_ylim(bottom=0)
    return fig
