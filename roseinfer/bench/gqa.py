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


KV_HEADS = {"MHA (9 KV heads)": 9, "GQA (3 KV heads)": 3}


def measure(engines: dict[str, InferenceEngine], prompts: list[list[int]], max_new_tokens: int, repeats: int,
            cases: dict[str, tuple], backend) -> tuple[dict[str, list[dict]], dict[str, list[float]]]:
    """Interleaved rounds (the order alternating): each engine serves the burst once (`serve_once`) and one
    layer's decode attention is timed on its case. Returns ({label: [serve_once's dict a round]},
    {label: [attention ms a round]}). Warms each engine up first (the kernels' first calls)."""
    for engine in engines.values():
        serve_once(engine, prompts[:2], 2)
    runs: dict[str, list[dict]] = {label: [] for label in engines}
    attn_ms: dict[str, list[float]] = {label: [] for label in engines}
    for round_ in range(repeats):
        for label in (list(engines) if round_ % 2 == 0 else list(engines)[::-1]):
            runs[label].append(serve_once(engines[label], prompts, max_new_tokens))
            attn_ms[label].append(time_decode_attention(backend, cases[label]))
    return runs, attn_ms


@dataclasses.dataclass
class Summary:
    """What notebook 12's measurement shows, per variant (keyed by label), with the two verdicts."""

    tok_s: dict[str, list[float]]
    attn_ms: dict[str, list[float]]
    tokens: dict[str, int]  # KV tokens the budget holds
    whole: dict[str, int]  # whole requests (prompt + new tokens) those hold
    most: dict[str, int]  # most sequences in one step, over the runs
    mean: dict[str, float]  # median over runs of the sequences in an average step
    step: dict[str, float]  # median over runs of the time a step, ms
    preempted: dict[str, float]  # median preemptions a run
    read: dict[str, int]  # bytes one layer's decode attention reads
    v_tput: object
    v_attn: object

    def ratio(self, field: str) -> float:
        """GQA's figure over MHA's."""
        mha, gqa = (getattr(self, field)[label] for label in KV_HEADS)
        return gqa / mha

    def table(self) -> str:
        """A small table, one row a figure: MHA | GQA | GQA over MHA."""
        mha, gqa = KV_HEADS
        from roseinfer.bench.stats import median

        med = {k: {label: median(v[label]) for label in KV_HEADS}
               for k, v in (("tok_s", self.tok_s), ("attn_ms", self.attn_ms))}
        rows = [("KV tokens in the budget", self.tokens, "{:.0f}", self.ratio("tokens")),
                ("whole requests they hold", self.whole, "{:.0f}", None),
                ("most sequences in a step", self.most, "{:.0f}", self.ratio("most")),
                ("sequences in an average step", self.mean, "{:.1f}", self.ratio("mean")),
                ("time a step (ms)", self.step, "{:.1f}", self.ratio("step")),
                ("preemptions a run", self.preempted, "{:.0f}", None),
                ("output tok/s", med["tok_s"], "{:.1f}", self.v_tput.ratio),
                ("one layer's attention (ms)", med["attn_ms"], "{:.2f}", med["attn_ms"][gqa] / med["attn_ms"][mha]),
                ("  bytes it reads (MiB)", {k: v / 2**20 for k, v in self.read.items()}, "{:.0f}",
                 self.ratio("read"))]
        lines = [f"{'':30}{'MHA':>9}{'GQA':>9}  GQA / MHA"]
        for name, values, fmt, ratio in rows:
            lines.append(f"{name:30}{fmt.format(values[mha]):>9}{fmt.format(values[gqa]):>9}"
                         + (f"  {ratio:.2f}x" if ratio is not None else ""))
        return "\n".join(lines)


def summarize(runs: dict[str, list[dict]], attn_ms: dict[str, list[float]], engines: dict[str, InferenceEngine],
              request_tokens: int, attn_batch: int, attn_context: int, head_dim: int = 64) -> Summary:
    """The measurement's figures and verdicts (MHA before, GQA after); `request_tokens` = prompt + new tokens."""
    from roseinfer.bench.stats import median, verdict

    mha, gqa = KV_HEADS
    tok_s = {label: [r["tok_s"] for r in rs] for label, rs in runs.items()}
    tokens = {label: e.num_kv_blocks * e.config.block_size for label, e in engines.items()}
    return Summary(
        tok_s=tok_s, attn_ms=attn_ms, tokens=tokens,
        whole={label: t // request_tokens for label, t in tokens.items()},
        most={label: max(r["most_in_a_step"] for r in rs) for label, rs in runs.items()},
        mean={label: median([r["mean_in_a_step"] for r in rs]) for label, rs in runs.items()},
        step={label: median([r["step_ms"] for r in rs]) for label, rs in runs.items()},
        preempted={label: median([r["preemptions"] for r in rs]) for label, rs in runs.items()},
        read={label: kv_bytes_read(attn_batch, attn_context, kv, head_dim) for label, kv in KV_HEADS.items()},
        v_tput=verdict("throughput at the same KV memory", tok_s[mha], tok_s[gqa], "tok/s", higher_is_better=True,
                       labels=(mha, gqa)),
        v_attn=verdict("one layer's decode attention", attn_ms[mha], attn_ms[gqa], "ms", higher_is_better=False,
                       labels=(mha, gqa)))


def plot(summary: Summary, title: str):
    """Three panels (KV tokens in the budget, output tok/s, one layer's attention): every run a dot, the median a
    bar."""
    import matplotlib.pyplot as plt

    from roseinfer.bench.stats import median

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    colors = dict(zip(KV_HEADS, ("#7f7f7f", "#d9534f")))
    panels = (("KV tokens in the same memory", {k: [v] for k, v in summary.tokens.items()}),
              ("output tok/s, a burst at that memory", summary.tok_s),
              ("one layer's decode attention (ms)", summary.attn_ms))
    for ax, (name, data) in zip(axes, panels):
        for i, label in enumerate(KV_HEADS):
            ax.bar(i, median(data[label]), color=colors[label], alpha=0.4)
            ax.plot([i] * len(data[label]), data[label], "o", color=colors[label], ms=4)
        ax.set_xticks(range(2), list(KV_HEADS))
        ax.set_title(name)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


KERNEL = Path(__file__).resolve().parents[1] / "kernels" / "cpu" / "paged_decode.c"


def kernel_lines(*needles: str) -> str:
    """The lines of the C decode kernel (roseinfer/kernels/cpu/paged_decode.c) that contain any of `needles`,
    each with its line number: where a query head finds its KV head."""
    lines = KERNEL.read_text().splitlines()
    return "\n".join(f"paged_decode.c:{i + 1}: {line.strip()}" for i, line in enumerate(lines)
                     if any(n in line for n in needles))
