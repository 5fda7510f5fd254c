"""Multi-head against grouped-query attention on one architecture (notebook 12).

Two models that differ only in their KV heads: SmolLM2-135M's shape with its real 3 KV heads for 9 query heads,
and the same shape with 9 (multi-head attention, as GPT-2 has). Each is built by transformers with random weights
and saved in Hugging Face layout, so roseinfer loads it as a user's checkpoint and transformers is its oracle.

- `build_pair`: the two checkpoints and transformers' models;
- `decode_attention_case` / `time_decode_attention`: one layer's decode attention through the C kernel on a
  random paged cache, the bytes it must read and the time it takes;
- `serve_once`: a burst of requests through one engine whose KV pool is held to a byte budget.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import torch

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.attention.base import AttentionMetadata
from roseinfer.config import PRESETS, ModelConfig
from roseinfer.engine.runner import kv_cache_bytes_per_block
from roseinfer.models.registry import model_family

WEIGHT_SCALE = 3.0  # random N(0, 0.02) weights repeat one token; scaled, greedy decoding wanders


def shape(n_layer: int | None = None, n_kv_head: int | None = None) -> ModelConfig:
    """SmolLM2-135M's architecture, optionally with fewer layers (CI) or another KV head count."""
    base = PRESETS["smollm2-135m"]
    return dataclasses.replace(base, n_layer=n_layer or base.n_layer, n_kv_head=n_kv_head or base.n_kv_head)


def build_pair(directory: Path, n_layer: int | None = None, seed: int = 0) -> dict[str, tuple[Path, object]]:
    """{"MHA (9 KV heads)": (checkpoint dir, transformers model), "GQA (3 KV heads)": ...}, same seed each."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's "Writing model shards" bar, in a notebook's output
    pair = {}
    for label, kv_heads in (("MHA (9 KV heads)", 9), ("GQA (3 KV heads)", 3)):
        config = shape(n_layer, kv_heads)
        hf_config = LlamaConfig(**{k: v for k, v in model_family("llama").config_to_hf(config).items()
                                   if k not in ("model_type", "architectures")})
        torch.manual_seed(seed)
        model = LlamaForCausalLM(hf_config).float().eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("_proj.weight"):
                    param.mul_(WEIGHT_SCALE)
        path = Path(directory) / f"smollm2-135m-shape-{kv_heads}kv"
        model.save_pretrained(path)
        pair[label] = (path, model)
    return pair


def decode_attention_case(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                          block_size: int = 16, seed: int = 0):
    """One layer's decode step over `batch` sequences of `context` cached tokens, their blocks shuffled through
    the pool: (query, key, value, k_cache, v_cache, meta)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_each = -(-context // block_size)
    num_blocks = batch * blocks_each
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    k_cache = torch.randn((num_blocks, block_size, kv_heads, head_dim), generator=gen)
    v_cache = torch.randn((num_blocks, block_size, kv_heads, head_dim), generator=gen)
    tables = torch.tensor(order, dtype=torch.int32).view(batch, blocks_each)
    last = context - 1  # the new token's slot: the last position of each sequence
    slots = (tables[:, last // block_size].long() * block_size + last % block_size)
    meta = AttentionMetadata(slots, tables, torch.full((batch,), context, dtype=torch.int32),
                             torch.arange(batch + 1, dtype=torch.int32), 1, context)
    query = torch.randn((batch, heads, head_dim), generator=gen)
    key = torch.randn((batch, kv_heads, head_dim), generator=gen)
    value = torch.randn((batch, kv_heads, head_dim), generator=gen)
    return query, key, value, k_cache, v_cache, meta


def kv_bytes_read(batch: int, context: int, kv_heads: int, head_dim: int, element_bytes: int = 4) -> int:
    """What one layer's decode attention must read: every cached key and value of every sequence, once."""
    return 2 * batch * context * kv_heads * head_dim * element_bytes


def time_decode_attention(backend, case, repeats: int = 20) -> float:
    """Median milliseconds of one layer's decode attention (the KV write included, as in a step)."""
    query, key, value, k_cache, v_cache, meta = case
    scale = query.shape[-1] ** -0.5
    for _ in range(3):
        backend.forward(query, key, value, k_cache, v_cache, meta, scale)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.forward(query, key, value, k_cache, v_cache, meta, scale)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1000


def blocks_for_budget(config: ModelConfig, budget_bytes: int, block_size: int = 16) -> int:
    """How many KV blocks of this model fit in `budget_bytes` (fp32)."""
    return budget_bytes // kv_cache_bytes_per_block(config, block_size, torch.float32)


def serve_once(engine: InferenceEngine, prompts: list[list[int]], max_new_tokens: int) -> dict[str, float]:
    """All the prompts at once through one scheduler, greedy: output tok/s, the most sequences that ran in one
    step, the preemptions the pool forced, and tok/s's two factors: the sequences a step emitted a token for, on
    average, and the mean time of a step (tok/s = mean_in_a_step / step_ms, in tokens a millisecond)."""
    scheduler = engine.new_scheduler(max_batch_size=len(prompts))
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_on_eos=False)
    start = time.perf_counter()
    rids = [engine.add_request(scheduler, prompt_token_ids=p, params=params) for p in prompts]
    most = steps = emitted = 0
    while scheduler.has_unfinished():
        outputs = len(engine.step(scheduler))
        most, steps, emitted = max(most, outputs), steps + 1, emitted + outputs
    seconds = time.perf_counter() - start
    tokens = sum(len(scheduler.pop_response(r).token_ids) for r in rids)
    return {"tok_s": tokens / seconds, "most_in_a_step": most, "mean_in_a_step": emitted / steps,
            "step_ms": seconds / steps * 1e3, "preemptions": scheduler.kv_stats()["num_preemptions"],
            "seconds": seconds}
