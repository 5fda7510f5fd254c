"""Notebook 05's measurements: an idle worker that polls every 5 ms against one that sleeps on an event.

- `idle_runs`: wake-ups and the worker thread's own CPU time per second while nothing is asked of it;
- `light_load_runs`: one request at a time, every few ms: TTFT p50, its stages (means, which add up) and ITL;
- `summarize` -> `WakeupNumbers`: the verdicts, the stage table and the half-nap arithmetic in a few printed
  lines, and `assert_directions()` for what the notebook's prose claims;
- `submit_in_the_window` with `EventUnderLock`: one request submitted exactly between the idle worker's check
  for work and its wait, held open by a hook, so the lost wake-up shows every time, not once in a million;
- `plot_wakeup`: the notebook's three panels; `gpt2_ttft_ms`: notebook 04's saved gpt2 TTFT, for scale.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from roseinfer.bench.instrument import worker_cpu_seconds
from roseinfer.bench.stats import Verdict, median, verdict
from roseinfer.bench.streaming import StreamingSetup, run_streaming
from roseinfer.history import make_manager
from roseinfer.sampling import SamplingParams
from roseinfer.server.manager import SchedulerManager

# Where a request's TTFT goes: stages that do not overlap, so per request they add up to its TTFT exactly, and
# their means to the mean TTFT (medians do not add up).
STAGE_NAMES = {"enter_add_request_ms": "into add_request", "tokenize_ms": "tokenize",
               "queue_wait_ms": "queue wait", "prefill_to_first_token_ms": "prefill + first token",
               "delivery_ms": "to the consumer thread"}
COLORS = ("#7f7f7f", "#d9534f")


def idle_runs(engine, variants: Mapping[str, str], repeats: int, idle_seconds: float,
              settle_s: float = 0.05) -> dict[str, dict[str, list[float]]]:
    """Each variant's idle wake-ups per second and its worker thread's CPU ms per second, `repeats` times each,
    interleaved. The CPU time is the worker thread's own clock, not the process's (the kernel has threads too)."""
    idle: dict[str, dict[str, list[float]]] = {v: {"wakeups_per_s": [], "cpu_ms_per_s": []} for v in variants}
    for _ in range(repeats):
        for variant in variants:
            manager = make_manager(variant, engine)
            try:
                time.sleep(settle_s)  # let the worker reach its idle loop
                wakeups, cpu, start = manager.num_idle_wakeups, worker_cpu_seconds(manager), time.perf_counter()
                time.sleep(idle_seconds)
                elapsed = time.perf_counter() - start
                idle[variant]["wakeups_per_s"].append((manager.num_idle_wakeups - wakeups) / elapsed)
                idle[variant]["cpu_ms_per_s"].append((worker_cpu_seconds(manager) - cpu) * 1000 / elapsed)
            finally:
                manager.close()
    return idle


def light_load_runs(engine, variants: Mapping[str, str], setup: StreamingSetup, repeats: int) -> dict[str, Any]:
    """`setup`'s requests through each variant, `repeats` times, interleaved. Per run: TTFT p50 and mean, the mean
    of every TTFT stage, and ITL p50 (the gaps between a request's tokens as the worker produced them)."""
    runs: dict[str, Any] = {"ttft_p50_ms": {v: [] for v in variants}, "ttft_mean_ms": {v: [] for v in variants},
                            "stage_mean_ms": {v: {s: [] for s in STAGE_NAMES} for v in variants},
                            "itl_p50_ms": {v: [] for v in variants}}
    for _ in range(repeats):
        for variant in variants:
            metrics, _ = run_streaming(engine, variant, setup)
            runs["ttft_p50_ms"][variant].append(metrics["ttft_ms"]["p50"])
            runs["ttft_mean_ms"][variant].append(metrics["ttft_ms"]["mean"])
            runs["itl_p50_ms"][variant].append(metrics["itl_ms"]["p50"])
            for stage in STAGE_NAMES:
                runs["stage_mean_ms"][variant][stage].append(metrics[stage]["mean"])
    return runs


@dataclass
class WakeupNumbers:
    """What notebook 05's runs say, before (polling) against after (the event)."""

    names: tuple[str, str]  # the two variants' legend names, before then after
    ttft: Verdict  # TTFT p50 at light load
    itl: Verdict  # ITL p50 at light load
    nap_ms: float  # one nap as the idle polling worker lives it: 1 s / its wake-ups per second
    added_ms: float  # median TTFT p50, before minus after
    stage_ms: dict[str, dict[str, float]]  # variant -> stage -> mean over runs of each run's mean
    mean_ttft_ms: dict[str, float]  # variant -> mean over runs of each run's mean TTFT
    idle: dict[str, dict[str, float]]  # variant -> median wake-ups per second and worker CPU ms per second
    idle_apart: bool  # every before run's idle CPU above every after run's
    gpt2_ttft_ms: float | None = None  # notebook 04's gpt2 TTFT p50 at one request, for scale

    @property
    def half_nap_ms(self) -> float:
        return self.nap_ms / 2

    @property
    def added_wait_ms(self) -> float:
        before, after = self.stage_ms
        return self.stage_ms[before]["queue_wait_ms"] - self.stage_ms[after]["queue_wait_ms"]

    @property
    def cpu_per_wakeup_us(self) -> float:
        before, after = self.idle
        cpu = self.idle[before]["cpu_ms_per_s"] - self.idle[after]["cpu_ms_per_s"]
        wakeups = self.idle[before]["wakeups_per_s"]
        return cpu * 1000 / wakeups if wakeups else float("nan")

    def share(self, ttft_ms: float) -> float:
        """Half a nap as a share of a polling TTFT whose event-driven TTFT is `ttft_ms`."""
        return self.half_nap_ms / (ttft_ms + self.half_nap_ms)

    def __str__(self) -> str:
        before, after = self.stage_ms
        head = f"{'mean over requests (ms)':>24} {self.names[0]:>19} {self.names[1]:>14}  difference"
        rows = [head]
        for stage, label in {**STAGE_NAMES, "TTFT": "= TTFT"}.items():
            b, a = ((self.mean_ttft_ms[before], self.mean_ttft_ms[after]) if stage == "TTFT"
                    else (self.stage_ms[before][stage], self.stage_ms[after][stage]))
            rows.append(f"{label:>24} {b:19.2f} {a:14.2f}  {b - a:+10.2f}")
        ib, ia = self.idle[before], self.idle[after]
        here = self.share(median(list(self.ttft.after)))
        saved = self.added_ms / median(list(self.ttft.before))
        scale = (f"; with gpt2 (notebook 04's TTFT p50, {self.gpt2_ttft_ms:.1f} ms) "
                 f"{self.share(self.gpt2_ttft_ms):.0%}" if self.gpt2_ttft_ms else "")
        return "\n".join([
            str(self.ttft), str(self.itl), "", *rows, "",
            f"a nap: 1 s / {ib['wakeups_per_s']:.0f} idle wake-ups = {self.nap_ms:.2f} ms, half of it {self.half_nap_ms:.2f} ms; "
            f"TTFT p50 grew {self.added_ms:.2f} ms ({self.added_ms / self.half_nap_ms:.0%} of it), "
            f"the mean queue wait {self.added_wait_ms:.2f} ms ({self.added_wait_ms / self.half_nap_ms:.0%})",
            f"half a nap as a share of the polling TTFT: {here:.0%} here (measured: {saved:.0%}){scale}",
            f"idle: {ib['wakeups_per_s']:.0f} -> {ia['wakeups_per_s']:.0f} wake-ups/s, worker CPU "
            f"{ib['cpu_ms_per_s']:.2f} -> {ia['cpu_ms_per_s']:.2f} ms/s"
            + (", every run apart" if self.idle_apart else ", the runs overlap")
            + f": {self.cpu_per_wakeup_us:.0f} us of CPU a wake-up",
        ])

    def assert_directions(self) -> None:
        """The notebook's claims, so a rerun that contradicts one fails (not at CI's tiny sizes)."""
        assert self.ttft.better, "the event should cut the light-load TTFT"
        assert 0.5 < self.added_ms / self.half_nap_ms < 1.5, "the added TTFT should be about half a nap"
        assert self.added_wait_ms > self.half_nap_ms / 2, "the queue wait should hold most of the half nap"
        assert abs(self.itl.ratio - 1) < 0.15, "the gaps between a request's tokens should not move (no nap there)"
        assert self.idle_apart, "the event-driven worker should use less CPU while idle, in every run"
        if self.gpt2_ttft_ms:
            here = median(list(self.ttft.after))
            assert self.share(self.gpt2_ttft_ms) < self.share(here), "gpt2's prefill should dilute the half nap"


def summarize(light: Mapping[str, Any], idle: Mapping[str, Mapping[str, list[float]]], names: Mapping[str, str],
              gpt2_ttft_ms: float | None = None, itl_label: str = "ITL p50") -> WakeupNumbers:
    """`light_load_runs`' and `idle_runs`' results, the first variant of `names` as before, the second as after."""
    before, after = names
    labels = (names[before], names[after])
    for variant in names:  # the stages partition each request's TTFT: their means add up to the mean TTFT
        for run, total in enumerate(light["ttft_mean_ms"][variant]):
            parts = sum(light["stage_mean_ms"][variant][s][run] for s in STAGE_NAMES)
            if abs(parts - total) > 1e-6 * max(1.0, abs(total)):
                raise ValueError(f"{variant}, run {run}: the stages add up to {parts} ms, "
                                 f"the mean TTFT is {total} ms")
    p50 = light["ttft_p50_ms"]
    idle_medians = {v: {k: median(list(x)) for k, x in idle[v].items()} for v in names}
    return WakeupNumbers(
        names=labels,
        ttft=verdict("TTFT p50 at light load", p50[before], p50[after], "ms", higher_is_better=False,
                     labels=labels),
        itl=verdict(itl_label, light["itl_p50_ms"][before], light["itl_p50_ms"][after], "ms",
                    higher_is_better=False, labels=labels),
        nap_ms=1000 / wakeups if (wakeups := idle_medians[before]["wakeups_per_s"]) else float("nan"),
        added_ms=median(p50[before]) - median(p50[after]),
        stage_ms={v: {s: statistics.fmean(light["stage_mean_ms"][v][s]) for s in STAGE_NAMES} for v in names},
        mean_ttft_ms={v: statistics.fmean(light["ttft_mean_ms"][v]) for v in names},
        idle=idle_medians,
        idle_apart=min(idle[before]["cpu_ms_per_s"]) > max(idle[after]["cpu_ms_per_s"]),
        gpt2_ttft_ms=gpt2_ttft_ms,
    )


class EventUnderLock(SchedulerManager):
    """The real manager, with a hook between its check (and clear, under the lock) and its wait."""

    def __init__(self, *args, before_wait: Callable[[], None] | None = None, **kwargs) -> None:
        self.before_wait = before_wait
        super().__init__(*args, **kwargs)

    def _wait_for_work(self) -> None:
        if self.before_wait is not None:
            self.before_wait()
        super()._wait_for_work()


def submit_in_the_window(engine, manager_cls: type[SchedulerManager], hook_name: str, served_within_s: float = 1.0,
                         rescue_s: float = 10.0) -> str:
    """Submit one request exactly in the idle worker's window (`hook_name` runs there); was it served in time?

    The hook, the first time it runs, tells this thread the worker is in the window and holds the worker there
    until the request is submitted. "served" if its tokens come within `served_within_s`; otherwise a second
    request is submitted, and if that one's arrival is what gets the first served, the wake-up was lost."""
    window, submitted = threading.Event(), threading.Event()

    def hold_window_open() -> None:
        if not submitted.is_set():
            window.set()
            submitted.wait()

    manager = manager_cls(engine, **{hook_name: hold_window_open})  # the hook is in place before the worker starts
    try:
        if not window.wait(rescue_s):
            raise RuntimeError(f"the worker of {manager_cls.__name__} never reached its {hook_name} hook")
        stream = manager.submit(prompt="Hello", params=SamplingParams(max_new_tokens=2))
        submitted.set()
        try:
            list(stream.pieces(timeout=served_within_s))
            return "served"
        except queue.Empty:
            manager.submit(prompt="again", params=SamplingParams(max_new_tokens=2))
            list(stream.pieces(timeout=rescue_s))
            return "lost wake-up: served only when the next request arrived"
    finally:
        manager.close()


def gpt2_ttft_ms(device: str) -> float | None:
    """Notebook 04's saved gpt2 TTFT p50 (the event-driven manager, one request at a time), if there is one."""
    from roseinfer.bench.results import read_json, repo_root

    path = repo_root() / "results" / device / "nb04_scheduler_manager.json"
    try:
        metrics = read_json(path)["metrics"]
        return float(metrics["after_ttft_p50_ms"][metrics["concurrency"].index(1)])
    except (OSError, KeyError, ValueError, IndexError, TypeError):
        return None


def _runs_panel(ax, series: Mapping[str, list[float]], ylabel: str, title: str) -> None:
    """Every run a dot, the median a bar; variant names on the axis."""
    for i, values in enumerate(series.values()):
        ax.bar(i, median(values), color=COLORS[i], alpha=0.35, width=0.6)
        ax.plot([i] * len(values), values, "o", color=COLORS[i], ms=4)
        ax.annotate(f"{median(values):.3g}", (i + 0.32, median(values)), va="center", fontsize=9)
    ax.set_xticks(range(len(series)), list(series), fontsize=8)
    ax.set_xlim(-0.5, len(series) - 0.2)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)


def plot_wakeup(light: Mapping[str, Any], idle: Mapping[str, Mapping[str, list[float]]], names: Mapping[str, str],
                load: str, reference: tuple[str, dict[str, Any]] | None = None):
    """TTFT p50 at light load (with the event's plus half a nap: the polling TTFT predicted); idle wake-ups; idle
    CPU. `reference`: a (gpu tag, saved result) of this notebook, named in the first panel's title."""
    from roseinfer.bench import plots

    before, after = names
    fig, (ax1, ax2, ax3) = plots.figure(3, width=13 / 3, height=3.8)
    _runs_panel(ax1, {names[v]: light["ttft_p50_ms"][v] for v in names}, "TTFT p50 (ms)", f"light load, {load}")
    wakeups = median(idle[before]["wakeups_per_s"])
    if wakeups:
        predicted = median(light["ttft_p50_ms"][after]) + 500 / wakeups
        ax1.axhline(predicted, color="#1f77b4", ls="--", lw=1,
                    label="wake-up event + half a nap\n(the polling TTFT predicted)")
        # room above the line, the dots and the legend, so the dashed line never sits on the frame
        top = max([predicted, *(x for v in names for x in light["ttft_p50_ms"][v])])
        ax1.set_ylim(0, top * 1.35)
        ax1.legend(fontsize=8, loc="upper right")
    _runs_panel(ax2, {names[v]: idle[v]["wakeups_per_s"] for v in names}, "wake-ups per second", "idle")
    _runs_panel(ax3, {names[v]: idle[v]["cpu_ms_per_s"] for v in names}, "worker's CPU ms per second", "idle")
    if reference:
        tag, result = reference
        m = result["metrics"]
        ax1.set_title(ax1.get_title() + f"\n{tag}: {median(m['before_ttft_p50_ms']):.2f} -> "
                      f"{median(m['after_ttft_p50_ms']):.2f} ms")
    fig.tight_layout()
    return fig
