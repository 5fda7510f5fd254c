"""A roofline floor: how fast could this step be on this device at all?

A forward step has to do some FLOPs (the matmuls, the attention) and move
some bytes (every weight once, each context's keys and values). With the
device's measured matmul peak P and memory bandwidth W, no implementation can
finish a step faster than max(FLOPs / P, bytes / W). Dividing that floor by
a measured time says what fraction of the hardware a result uses.

Peaks are measured, not taken from a datasheet: a large matmul in the run's
dtype, and a large tensor copy.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from roseinfer.config import ModelConfig


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes: float

    def __add__(self, other: StepCost) -> StepCost:
        return StepCost(self.flops + other.flops, self.bytes + other.bytes)

    def floor_s(self, peaks: dict[str, float]) -> float:
        return max(self.flops / peaks["matmul_flops"], self.bytes / peaks["mem_bytes_s"])


def step_cost(
    config: ModelConfig, new_tokens: int, attended: float, num_logits: int, elem_bytes: int, kv_read: float
) -> StepCost:
    """One forward pass.

    new_tokens: tokens computed this step; attended: sum over them of the
    context each attends to; num_logits: rows that go through the LM head;
    kv_read: context tokens whose K/V must be read from the cache.
    """
    e, layers, v = config.n_embd, config.n_layer, config.vocab_size
    matmul_params = 12 * layers * e * e  # qkv, proj, two MLP matrices per layer
    flops = 2 * new_tokens * matmul_params + 2 * num_logits * e * v + 4 * layers * e * attended
    weight_bytes = (matmul_params + v * e) * elem_bytes
    kv_bytes = 2 * layers * e * elem_bytes * (kv_read + new_tokens)  # read the context, write the new
    return StepCost(flops, weight_bytes + kv_bytes)


def decode_step_cost(config: ModelConfig, context_lens: Sequence[int], elem_bytes: int) -> StepCost:
    total = float(sum(context_lens))
    return step_cost(config, len(context_lens), total, len(context_lens), elem_bytes, total)


def prefill_cost(config: ModelConfig, prompt_lens: Sequence[int], elem_bytes: int) -> StepCost:
    attended = sum(n * (n + 1) / 2 for n in prompt_lens)
    return step_cost(config, sum(prompt_lens), attended, len(prompt_lens), elem_bytes, 0.0)


def continuous_batching_floor(
    config: ModelConfig,
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_batch: int,
    elem_bytes: int,
    peaks: dict[str, float],
) -> dict[str, float]:
    """Floor for a whole workload run by an ideal continuous-batching engine.

    Requests are admitted in order as slots free up; each admission costs its
    prefill, each step one token per running request.
    """
    waiting = list(zip(prompt_lens, output_lens))[::-1]
    running: list[list[int]] = []  # [context length, tokens left]
    total = 0.0
    steps = 0
    while waiting or running:
        admitted = []
        while waiting and len(running) < max_batch:
            p, o = waiting.pop()
            admitted.append(p)
            if o > 1:
                running.append([p + 1, o - 1])
        if admitted:
            total += prefill_cost(config, admitted, elem_bytes).floor_s(peaks)
        if running:
            total += decode_step_cost(config, [c for c, _ in running], elem_bytes).floor_s(peaks)
            steps += 1
            for r in running:
                r[0] += 1
                r[1] -= 1
            running = [r for r in running if r[1] > 0]
    return {"floor_s": total, "decode_steps": steps}


@functools.lru_cache(maxsize=8)
def measure_peaks(
    device: str = "cpu", dtype: torch.dtype = torch.float32, small: bool = False
) -> dict[str, float]:
    """Measured matmul FLOP/s (in dtype) and copy bandwidth (bytes/s) on the device.

    small=True: a token-sized measurement that only exercises the code (CI), not a peak.
    """
    dev = torch.device(device)
    n = 128 if small else 4096 if dev.type == "cuda" else 1536
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    big = torch.empty(
        (1 if small else 256 if dev.type == "cuda" else 64) << 20, device=dev, dtype=torch.uint8
    )
    dst = torch.empty_like(big)

    def best(fn, reps: int) -> float:
        fn()
        times = []
        for _ in range(reps):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t)
        return min(times)

    mm = best(lambda: torch.mm(a, b), 5)
    copy = best(lambda: dst.copy_(big), 5)
    return {"matmul_flops": 2 * n**3 / mm, "mem_bytes_s": 2 * big.numel() / copy}
