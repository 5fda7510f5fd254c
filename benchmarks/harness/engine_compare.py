"""Workloads, summaries and roofline floors for benchmarks/compare_engines.py
(how far an engine's tokens agree with the reference's: roseinfer.bench.same_answer).

Three workloads, greedy with EOS ignored so every engine emits exactly the
same number of tokens:
    fixed   32 prompts of 32 tokens, 32 new tokens each
    mixed   32 prompts of 16-64 tokens, 8-128 new tokens each (seeded)
    batch1  one 32-token prompt, 128 new tokens: per-token latency
"""

from __future__ import annotations

import statistics
from typing import Any

from roseinfer.bench.roofline import workload_ceiling_tok_s
from roseinfer.bench.workloads import VOCAB_FOR_PROMPTS, BenchRequest, mixed_output_lengths, random_prompts
from roseinfer.config import ModelConfig

WORKLOADS = ("fixed", "mixed", "batch1")


def prompt_vocab(config: ModelConfig) -> int:
    """Prompt ids are drawn below this: GPT-2's ordinary tokens, or every id of a smaller vocabulary but
    its last (peer_models puts that model's one special token, end of text, there)."""
    return min(VOCAB_FOR_PROMPTS, config.vocab_size - 1)


def build_workloads(
    num_requests: int, seed: int, max_new_tokens: int | None = None, vocab: int = VOCAB_FOR_PROMPTS
) -> dict[str, list[dict]]:
    """The workloads as runner_io wants them; `max_new_tokens` caps every output (for quick runs); prompt ids
    below `vocab`."""
    sets: dict[str, list[BenchRequest]] = {
        "fixed": random_prompts(num_requests, 32, 32, seed, vocab),
        "mixed": mixed_output_lengths(num_requests, (16, 64), (8, 128), seed, vocab),
        "batch1": random_prompts(1, 32, 128, seed + 1, vocab),
    }
    cap = max_new_tokens or 1 << 30
    return {
        name: [{"prompt": r.prompt_token_ids, "max_new_tokens": min(r.max_new_tokens, cap)} for r in reqs]
        for name, reqs in sets.items()
    }


def summarize_engine(runs: list[dict[str, Any]], requests: list[dict]) -> dict[str, Any]:
    """Median and spread over runs of one engine on one workload (runs: runner_io's per-workload dicts)."""
    useful = sum(r["max_new_tokens"] for r in requests)
    tok_s = [useful / run["seconds"] for run in runs]
    ms_per_token = [1000 * run["seconds"] / useful for run in runs]
    lengths_ok = all(
        [len(t) for t in run["token_ids"]] == [r["max_new_tokens"] for r in requests] for run in runs
    )
    return {
        "output_throughput_tok_s": statistics.median(tok_s),
        "runs_tok_s": tok_s,
        "ms_per_token": statistics.median(ms_per_token),
        "runs_ms_per_token": ms_per_token,
        "exact_output_lengths": lengths_ok,
    }


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}


def roofline(config: ModelConfig, requests: list[dict], threads: int, small: bool = False,
             bandwidth: dict[str, float] | None = None) -> dict[str, float]:
    """Output tok/s no engine can beat on this CPU, in fp32, bf16 and int8 (int8 weights and products; measured
    peaks; small: see `workload_ceiling_tok_s`). bandwidth: read bytes/s per dtype name, measured beside the run
    judged (BandwidthWatch), in place of the bandwidth measured once a process."""
    import torch

    torch.set_num_threads(threads)
    prompt_lens = [len(r["prompt"]) for r in requests]
    output_lens = [r["max_new_tokens"] for r in requests]
    return {
        f"{name}_tok_s": workload_ceiling_tok_s(config, prompt_lens, output_lens, getattr(torch, dtype), small=small,
                                                mem_bytes_s=(bandwidth or {}).get(name))
        for name, dtype in DTYPES.items()
    }


class BandwidthWatch:
    """The memory's read bandwidth measured between engine runs, per dtype's readers (int8 weights are read as
    fp32's: see measure_peaks). An engine's run is judged against the better of the readings just before and
    just after it: the bandwidth of this machine swings up to 2x within minutes, so one ceiling a process can
    sit far below what a run met (a share over 100%)."""

    def __init__(self, threads: int, small: bool = False):
        import torch

        from roseinfer.bench.roofline import read_bandwidth_meter

        torch.set_num_threads(threads)
        self._meters = {name: read_bandwidth_meter("cpu", getattr(torch, dtype), small)
                        for name, dtype in DTYPES.items() if name != "int8"}
        self.readings: list[dict[str, float]] = []

    def read(self) -> dict[str, float]:
        """Measure now; the reading is kept (results record them all)."""
        reading = {name: meter() for name, meter in self._meters.items()}
        reading["int8"] = reading["fp32"]
        self.readings.append(reading)
        return reading

    def best(self) -> dict[str, float]:
        """Per dtype, the fastest reading so far: the ceiling of the whole run."""
        return {name: max(r[name] for r in self.readings) for name in DTYPES}


def around(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """A run's bandwidth: per dtype, the better of the readings either side of it."""
    return {name: max(before[name], after[name]) for name in before}
