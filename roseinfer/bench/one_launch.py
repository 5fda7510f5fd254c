"""Notebook 09's measurements: what a decode step pays per operation it dispatches, and what one launch a step saves.

CPU: the decoder layers as a Python loop (a call per operation) against one C call (models/fused_decode.py,
kernels/cpu/decode_layers.c); the switch is `fused_decode.enabled`. GPU: eager steps against CUDA graph replay.

- `one_call(on)`: a context in which decode steps take the one C call (True) or the Python loop (False);
- `one_call_rows(engine)`: the most rows a step may have for the one call to take it (0: never, on this engine);
- `count_step(engine)`: the torch operators (views, computing) and the Python function calls of one decode step;
- `same_answer(engine, prompts, new_tokens)`: greedy tokens and a step's logits, the loop against the one call;
- `greedy_through_scheduler(engine, prompts, new_tokens, max_batch_size)`: tokens, for the GPU path's check;
- `time_sides(engine, batch, context, rounds, steps, meter, twin)`: both sides interleaved, each round beside
  its floor (and the narrow twin's two sides);
- `narrow_twin(engine)`: the same family and depth at width 64, whose arithmetic is next to nothing;
- `gpu_eager_vs_graphs(engine, batches, context, rounds, repeats)`: eager steps and graph replay, interleaved;
- `graph_rows(rows)`: eager and replayed step medians by batch, from a GPU run's rows;
- `c_loop_source()` and `condition_source()`: the C loop and the one call's condition, as the notebook prints them;
- `plot_cpu(timings)`, `plot_gpu(rows, title)`: the notebook's figures.
"""

from __future__ import annotations

import inspect
import logging
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from roseinfer.bench.decode_step import decode_batch, step_times_ms
from roseinfer.bench.roofline import decode_step_cost
from roseinfer.bench.stats import median
from roseinfer.models import fused_decode
from roseinfer.sampling import SamplingParams

SIDES = ("loop", "one_call")
NAMES = {"loop": "Python loop (a call per op)", "one_call": "one C call", "triton_eager": "eager step",
         "triton_graphs": "CUDA graph replay"}
COLORS = {"loop": "#7f7f7f", "one_call": "#d9534f"}
C_LOOP = Path(__file__).resolve().parents[1] / "kernels" / "cpu" / "decode_layers.c"


@contextmanager
def one_call(on: bool) -> Iterator[None]:
    """Decode steps take the one C call where it can (on=True, the default) or the Python layer loop."""
    before = fused_decode.enabled
    fused_decode.enabled = on
    try:
        yield
    finally:
        fused_decode.enabled = before


def _fused(engine) -> fused_decode.FusedDecode | None:
    return engine.runner.model.__dict__.get("_fused_decode")


def one_call_rows(engine) -> int:
    """The most rows of a decode step the one call takes on this engine (0: it takes none: int8, oneDNN's or
    F.linear's projections, no C compiler)."""
    fused = _fused(engine)
    return fused.max_rows if fused is not None else 0


def count_step(engine, batch: int = 1, context: int = 16) -> dict[str, int]:
    """One decode step's torch operators (`operators` = `views` + `computing`) and Python function calls.

    A view (reshape, select, split...) is dispatched like any operator but computes nothing. The two are counted
    in two runs of the step, so that the operator counter's own Python is not counted as the step's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Operators(TorchDispatchMode):
        calls = views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            self.views += func.is_view
            return func(*args, **(kwargs or {}))

    python_calls = 0

    def profile(frame, event, arg) -> None:
        nonlocal python_calls
        python_calls += event == "call"

    with decode_batch(engine, batch, context) as step:
        engine.runner.execute(step)  # warm: nothing built on a first call is counted
        counter = Operators()
        with counter:
            engine.runner.execute(step)
        sys.setprofile(profile)
        try:
            engine.runner.execute(step)
        finally:
            sys.setprofile(None)
    return {"operators": counter.calls, "views": counter.views, "computing": counter.calls - counter.views,
            "python_calls": python_calls}


def _count_taken(fused: fused_decode.FusedDecode) -> tuple[list[bool], Callable[[], None]]:
    """Record what `fused.run` answers (True: the C call ran the layers); call the second value to stop."""
    answers: list[bool] = []
    run = fused.run

    def counted(*args, **kwargs) -> bool:
        answers.append(run(*args, **kwargs))
        return answers[-1]

    fused.run = counted  # an instance attribute: the class's method is left alone
    return answers, lambda: fused.__dict__.pop("run", None)


def same_answer(engine, prompts: list[str], new_tokens: int, context: int = 16) -> dict[str, Any]:
    """Each prompt generated alone (its decode steps have one row), through the one call and through the loop, and
    the logits of one batch-1 decode step both ways. `taken`: decode steps the one call ran, of `decode_steps`."""
    params = SamplingParams(max_new_tokens=new_tokens, stop_on_eos=False)
    fused = _fused(engine)
    answers, stop = _count_taken(fused) if fused is not None else ([], lambda: None)
    try:
        tokens = {}
        for side in SIDES:
            with one_call(side == "one_call"):
                tokens[side] = [engine.generate([p], params)[0].token_ids for p in prompts]
        taken = sum(answers)
        with decode_batch(engine, 1, context) as step:
            logits = {}
            for side in SIDES:  # the same step twice: it writes the same K/V at the same slot
                with one_call(side == "one_call"):
                    logits[side] = engine.runner.logits_for(step)
    finally:
        stop()
    # a decode step: every token after a prompt's first, and a one-token prompt's prefill (one row, nothing cached)
    decode_steps = sum(new_tokens - 1 + (len(engine.tokenizer.encode(p)) == 1) for p in prompts)
    return {"tokens_equal": tokens["loop"] == tokens["one_call"], "decode_steps": decode_steps,
            "taken": taken, "bitwise": torch.equal(logits["loop"], logits["one_call"]),
            "max_abs_diff": (logits["loop"] - logits["one_call"]).abs().max().item()}


def greedy_through_scheduler(engine, prompts: list[str], new_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Every prompt's greedy tokens through one scheduler (prefills, then decode batches that grow and shrink)."""
    scheduler = engine.new_scheduler(max_batch_size=max_batch_size)
    params = SamplingParams(max_new_tokens=new_tokens, stop_on_eos=False)
    ids = [engine.add_request(scheduler, prompt=p, params=params) for p in prompts]
    while scheduler.has_unfinished():
        engine.step(scheduler)
    return [scheduler.pop_response(i).token_ids for i in ids]


def time_sides(engine, batch: int, context: int, rounds: int, steps: int,
               meter: Callable[[], float] | None = None, twin=None) -> dict[str, Any]:
    """`rounds` rounds of the same decode step through the loop and through the one call (the order alternating),
    each side's figure a round the median of `steps` steps (model, sampling, host sync). With `meter` (bytes/s, see
    roofline.read_bandwidth_meter) each round first measures the memory's read bandwidth, for the step's floor:
    its bytes (every weight once, the K/V) at that bandwidth. With `twin` (see narrow_twin) each round also times
    the twin's step both ways, right after the model's, so that a drift of the machine hits both: out["twin"]."""
    bytes_ = decode_step_cost(engine.model_config, [context] * batch, engine.runner.dtype.itemsize).bytes
    timed = {"model": engine} | ({"twin": twin} if twin is not None else {})
    runs: dict[tuple[str, str], list[float]] = {(k, side): [] for k in timed for side in SIDES}
    floor_ms: list[float] = []
    with ExitStack() as stack:
        decode = {k: stack.enter_context(decode_batch(e, batch, context)) for k, e in timed.items()}
        for r in range(rounds):
            if meter is not None:
                floor_ms.append(bytes_ / meter() * 1e3)
            for k, e in timed.items():
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    with one_call(side == "one_call"):
                        runs[k, side].append(median(step_times_ms(e, decode[k], steps)))
    out: dict[str, Any] = {"batch": batch, "context": context, "step_mb": bytes_ / 1e6, "floor_ms": floor_ms,
                           **{f"{side}_ms": runs["model", side] for side in SIDES}}
    for side in SIDES:  # each round against its own floor: a virtual machine's bandwidth drifts within minutes
        out[f"{side}_x_floor"] = [t / f for t, f in zip(out[f"{side}_ms"], floor_ms)]
    if twin is not None:
        out["twin"] = {"n_layer": twin.model_config.n_layer, "n_embd": twin.model_config.n_embd,
                       **{f"{side}_ms": runs["twin", side] for side in SIDES}}
    return out


def narrow_twin(engine, width: int = 64, seed: int = 0):
    """An engine of the same family, depth and KV grouping as `engine`'s model, at `width` (heads of 16): the same
    Python and the same kernels a step, with next to no arithmetic in them. Random weights; `engine`'s dtype."""
    from roseinfer import InferenceEngine
    from roseinfer.models.loader import save_checkpoint
    from roseinfer.models.registry import model_family

    config = engine.model_config
    group = config.n_head // config.n_kv_head
    heads = max(1, width // 16 // group) * group
    narrow = replace(config, n_embd=width, n_head=heads, n_kv_head=heads // group, head_dim=16,
                     intermediate_size=4 * width)
    with torch.device("meta"):
        model = model_family(narrow.family)(narrow)
    state = model.to_empty(device="cpu").init_random_(seed).state_dict()
    logger = logging.getLogger("roseinfer")  # the twin's tokens are never decoded: no "no tokenizer" warning
    level = logger.level
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "narrow.pt"
        save_checkpoint(path, narrow, state)
        logger.setLevel(logging.ERROR)
        try:
            return InferenceEngine.from_pretrained(str(path), dtype=engine.runner.dtype, num_kv_blocks=64,
                                                   max_batch_size=engine.config.max_batch_size)
        finally:
            logger.setLevel(level)


def gpu_eager_vs_graphs(engine, batches: list[int], context: int, rounds: int,
                        repeats: int) -> tuple[list[dict[str, Any]], dict[tuple[str, int], list[float]]]:
    """Eager steps and graph replay on one engine (cuda_graph=True), alternating round by round (the graphs are
    switched off for the eager rounds) over the same cached context, so a drift of the machine hits both alike.
    Returns the result rows (variant, batch, context, step_ms, step_ms_runs) and the runs by (variant, batch)."""
    graphs, runs = engine.runner.graphs, {}
    try:
        for batch in batches:
            with decode_batch(engine, batch, context) as step:
                for _ in range(rounds):
                    for variant, g in (("triton_eager", None), ("triton_graphs", graphs)):
                        engine.runner.graphs = g
                        runs.setdefault((variant, batch), []).append(median(step_times_ms(engine, step, repeats)))
    finally:
        engine.runner.graphs = graphs
    rows = [{"variant": v, "batch": b, "context": context, "step_ms": median(r), "step_ms_runs": r}
            for (v, b), r in runs.items()]
    return rows, runs


def graph_rows(rows: list[dict[str, Any]], context: int | None = None) -> dict[int, dict[str, list[float]]]:
    """{batch: {"triton_eager": runs, "triton_graphs": runs}} at one context (the given one, else the first row's),
    for the batches that have both; a row without its runs counts as one run of its median."""
    context = context if context is not None else rows[0]["context"]
    out: dict[int, dict[str, list[float]]] = {}
    for row in rows:
        if row["context"] == context:
            out.setdefault(row["batch"], {})[row["variant"]] = list(row.get("step_ms_runs") or [row["step_ms"]])
    return {b: v for b, v in sorted(out.items()) if {"triton_eager", "triton_graphs"} <= set(v)}


def c_loop_source() -> str:
    """decode_layers.c's loop over the layers: what runs in place of the Python loop."""
    lines = C_LOOP.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "for (int64_t l = 0;" in line)
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == " " * indent + "}")
    return f"// --- {C_LOOP.name}: decode_layers(), the loop\n" + textwrap.dedent("\n".join(lines[start:end + 1]))


def condition_source() -> str:
    """The lines of FusedDecode.run that decide whether the one call takes a step (else: False, the loop runs)."""
    lines = textwrap.dedent(inspect.getsource(fused_decode.FusedDecode.run)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("if not (enabled"))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "return False")
    return ("# --- roseinfer.models.fused_decode.FusedDecode.run: when the one call takes a step\n"
            + textwrap.dedent("\n".join(lines[start:end + 1])))


def plot_cpu(timings: dict[str, dict[str, Any]], title: str):
    """Each model's rounds as multiples of its floor, the loop beside the one call (bars: medians)."""
    from roseinfer.bench import plots

    fig, (ax,) = plots.figure(1, width=5.5, height=3.6)
    for m, model in enumerate(timings):
        for s, side in enumerate(SIDES):
            x, values = 3 * m + s, timings[model][f"{side}_x_floor"]
            ax.bar(x, median(values), color=COLORS[side], alpha=0.35, width=0.8, label=NAMES[side] if m == 0 else None)
            ax.plot([x] * len(values), values, "o", color=COLORS[side], ms=4)
            ax.annotate(f"{median(timings[model][f'{side}_ms']):.1f} ms", (x, max(values)), ha="center",
                        va="bottom", fontsize=8, xytext=(0, 4), textcoords="offset points")
    ax.axhline(1, color="black", lw=1, ls="--", label="floor: the step's bytes at the measured bandwidth")
    ax.set_xticks([3 * m + 0.5 for m in range(len(timings))], list(timings))
    top = max(v for t in timings.values() for side in SIDES for v in t[f"{side}_x_floor"])
    ax.set(ylabel="step time / its floor (each round)", ylim=(0, top * 1.25), title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_gpu(rows: list[dict[str, Any]], title: str):
    """Eager step and graph replay, ms a step by batch (every run a dot, the band their spread)."""
    from roseinfer.bench import plots

    by_batch = graph_rows(rows)
    fig, (ax,) = plots.figure(1, width=5.5, height=3.6)
    series = {NAMES[v]: (list(by_batch), [by_batch[b][v] for b in by_batch]) for v in ("triton_eager", "triton_graphs")}
    plots.curve(ax, series, "batch size", "ms per decode step", title, logx=True)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig
