"""Model presets and engine settings.

`ModelConfig` describes an architecture of one of the families in
roseinfer.models.registry (it is what a checkpoint's config.json holds); `EngineConfig` describes how the engine runs it (device,
dtype, KV pool, batching limits). Both are plain dataclasses so a notebook can
print them and a benchmark can write them into its result file.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

from roseinfer.cpu_class import emulated_class

GPT2_VOCAB_SIZE = 50257
GPT2_EOS_TOKEN_ID = 50256


@dataclass(frozen=True)
class ModelConfig:
    """An architecture, whatever its family: sizes, heads, vocabulary, context.

    `family` names the model class (roseinfer.models.registry) that owns the
    conversion from and to a Hugging Face config.json and state dict. The KV
    cache is shaped by `n_kv_head` and `head_dim`: grouped-query attention
    (several query heads sharing one KV head) keeps fewer K/V heads than
    query heads; GPT-2 keeps one for each.
    """

    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_positions: int = 1024
    vocab_size: int = GPT2_VOCAB_SIZE
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int = GPT2_EOS_TOKEN_ID
    family: str = "gpt2"
    n_kv_head: int = 0  # 0: n_head (multi-head attention)
    head_dim: int = 0  # 0: n_embd // n_head
    # The Llama family's (roseinfer.models.llama); GPT-2 leaves them at their defaults.
    intermediate_size: int = 0  # the MLP's hidden width; 0: 4 * n_embd
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # config.json's rope_scaling, as sorted items
    tie_word_embeddings: bool = True  # the LM head is the token embedding
    attention_bias: bool = False  # biases on q, k and v (Qwen2 has them)
    stop_token_ids: tuple[int, ...] = ()  # ends of turn besides eos_token_id (generation_config.json)

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # as config.json and asdict() hold it
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        elif self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", tuple(tuple(item) for item in self.rope_scaling))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not self.intermediate_size:
            object.__setattr__(self, "intermediate_size", 4 * self.n_embd)
        if not self.head_dim:
            if self.n_embd % self.n_head:
                raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
            object.__setattr__(self, "head_dim", self.n_embd // self.n_head)
        if not self.n_kv_head:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")


PRESETS: dict[str, ModelConfig] = {
    "gpt2": ModelConfig(n_embd=768, n_layer=12, n_head=12),
    "gpt2-medium": ModelConfig(n_embd=1024, n_layer=24, n_head=16),
    "gpt2-large": ModelConfig(n_embd=1280, n_layer=36, n_head=20),
    "gpt2-xl": ModelConfig(n_embd=1600, n_layer=48, n_head=25),
    "distilgpt2": ModelConfig(n_embd=768, n_layer=6, n_head=12),
    # GPT-2's vocabulary and context with a toy body: fast enough for CPU tests and CI notebooks.
    "gpt2-tiny": ModelConfig(n_embd=64, n_layer=2, n_head=4),
    # The Llama family (RoPE, RMSNorm, grouped-query attention, gated SiLU MLP), as their config.json say.
    "smollm2-135m": ModelConfig(
        n_embd=576, n_layer=30, n_head=9, n_kv_head=3, intermediate_size=1536, n_positions=8192,
        vocab_size=49152, layer_norm_epsilon=1e-5, eos_token_id=0, family="llama", rope_theta=100000.0,
    ),
    "smollm2-360m": ModelConfig(
        n_embd=960, n_layer=32, n_head=15, n_kv_head=5, intermediate_size=2560, n_positions=8192,
        vocab_size=49152, layer_norm_epsilon=1e-5, eos_token_id=0, family="llama", rope_theta=100000.0,
    ),
    "qwen2.5-0.5b": ModelConfig(
        n_embd=896, n_layer=24, n_head=14, n_kv_head=2, intermediate_size=4864, n_positions=32768,
        vocab_size=151936, layer_norm_epsilon=1e-6, eos_token_id=151643, family="qwen2", rope_theta=1000000.0,
        attention_bias=True,
    ),
    "llama-3.2-1b": ModelConfig(
        n_embd=2048, n_layer=16, n_head=32, n_kv_head=8, intermediate_size=8192, n_positions=131072,
        vocab_size=128256, layer_norm_epsilon=1e-5, eos_token_id=128001, family="llama", rope_theta=500000.0,
        rope_scaling=(("factor", 32.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                      ("original_max_position_embeddings", 8192), ("rope_type", "llama3")),
        stop_token_ids=(128008, 128009),
    ),
    # A toy Llama on GPT-2's vocabulary (so the embedded BPE tokenizes for it offline): tests and CI.
    "llama-tiny": ModelConfig(
        n_embd=64, n_layer=2, n_head=4, n_kv_head=2, intermediate_size=128, n_positions=1024,
        family="llama", tie_word_embeddings=False,
    ),
}

# The Hugging Face Hub ids a preset name resolves to (local cache, then download), canonical id first.
PRESET_HF_IDS: dict[str, tuple[str, ...]] = {
    "gpt2": ("openai-community/gpt2", "gpt2"),
    "gpt2-medium": ("openai-community/gpt2-medium", "gpt2-medium"),
    "gpt2-large": ("openai-community/gpt2-large", "gpt2-large"),
    "gpt2-xl": ("openai-community/gpt2-xl", "gpt2-xl"),
    "distilgpt2": ("distilbert/distilgpt2", "distilgpt2"),
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M",),
    "smollm2-360m": ("HuggingFaceTB/SmolLM2-360M",),
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B",),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B",),
}


def preset_for(name: str) -> str | None:
    """The preset a name or Hub id stands for ("openai-community/gpt2" -> "gpt2"), if any."""
    if name in PRESETS:
        return name
    return next((preset for preset, ids in PRESET_HF_IDS.items() if name in ids), None)


DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def _torch_cpu_has(probe: str) -> bool:
    """One of torch.cpu's feature probes, False where this torch lacks it."""
    return getattr(torch.cpu, probe, lambda: False)()


def amx_bf16_cpu() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later): matrix units that multiply whole bf16 tiles.

    Under `roseinfer.cpu_class` (a narrower class emulated), the class's answer: none of them has AMX.
    """
    return emulated_class() is None and _torch_cpu_has("_is_amx_tile_supported")


def native_bf16_cpu() -> bool:
    """Whether this CPU computes in bf16 natively (AVX512-BF16 or AMX), not by emulation (the class's answer
    under `roseinfer.cpu_class`: no)."""
    return emulated_class() is None and (_torch_cpu_has("_is_avx512_bf16_supported") or amx_bf16_cpu())


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The run dtype; None or "auto" picks bf16 on CUDA and on CPUs with native bf16, else fp32.

    On a CPU, `ROSEINFER_CPU_DTYPE` (float32 | bfloat16 | auto) replaces "auto":
    `make test` sets it to float32, so that the suite and the notebooks compare
    exact fp32 tokens whatever CPU runs them (bf16 has tests of its own).
    """
    if (dtype is None or dtype == "auto") and device.type == "cpu":
        dtype = os.environ.get("ROSEINFER_CPU_DTYPE", "auto")
    if dtype is None or dtype == "auto":
        native = device.type == "cuda" or (device.type == "cpu" and native_bf16_cpu())
        return torch.bfloat16 if native else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}") from None


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler's limits (OnlineScheduler); EngineConfig takes its defaults from here, under the same names."""

    max_batch_size: int = 64  # running requests per step
    max_num_batched_tokens: int = 2048  # tokens computed per step (decodes + prefill chunks)
    # A burst of new prompts all prefilling in one step stalls every running decode for
    # that step; capping admissions spreads the burst over several steps (None: max_batch_size).
    prefill_max_batch_size: int | None = None
    enable_prefix_cache: bool = True

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> SchedulerLimits:
        """The limits named in `config` (an EngineConfig), with every non-None override applied."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise TypeError(f"unknown scheduler option(s): {', '.join(unknown)}")
        values = {n: getattr(config, n) for n in names}
        values.update({n: v for n, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def max_prefills_per_step(self) -> int:
        return self.prefill_max_batch_size or self.max_batch_size


# EngineConfig.quantization's values (models/packed_linear.py's QUANTIZED kernels).
QUANTIZATIONS = ("int8", "int8-weight-only")


@dataclass
class EngineConfig:
    """How the engine runs a model. Every field can be passed to `from_pretrained`."""

    device: str = "cpu"
    dtype: str | None = None  # None ("auto"): bf16 on CUDA and on CPUs with native bf16, else fp32
    seed: int = 0  # seeds random weights when no checkpoint is found
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float | None = None  # None: 1 GiB on CPU, 40% of free memory on CUDA
    # The scheduler's limits (SchedulerLimits says what each one means).
    max_batch_size: int = SchedulerLimits.max_batch_size
    max_num_batched_tokens: int = SchedulerLimits.max_num_batched_tokens
    prefill_max_batch_size: int | None = SchedulerLimits.prefill_max_batch_size
    enable_prefix_cache: bool = SchedulerLimits.enable_prefix_cache
    attention_backend: str | None = None  # None: attention.registry.default_attention_backend
    cuda_graph: bool | None = None  # None: on for CUDA with the triton backend
    compile_decode: bool = False  # CPU: decode steps through torch.compile (compiled at first use; see 09)
    nvtx: bool = False  # NVTX ranges around each step's phases, for Nsight (CUDA only)
    packed_cpu_weights: bool = True  # fp32 on CPU: projections in oneDNN's layout (much faster decode)
    # CPU projections' kernel: auto | onednn | roseinfer (bf16) | torch (F.linear); see models/packed_linear.py.
    # ROSEINFER_CPU_LINEAR, read here once, overrides the default.
    cpu_linear: str = dataclasses.field(default_factory=lambda: os.environ.get("ROSEINFER_CPU_LINEAR", "auto").lower())
    # CPU: int8 weights for every projection and the LM head, one scale per output channel (a quarter of the
    # bytes a step reads). "int8": activations quantized per row too, int8 x int8 products (VNNI where the CPU
    # has it); "int8-weight-only": fp32 arithmetic on the widened weights. None: the dtype's weights.
    quantization: str | None = None
    checkpoint_path: str | None = None  # a roseinfer checkpoint file
    hf_model_id: str | None = None  # a Hub id: the local HF cache, else downloaded
    offline: bool = False  # never reach the Hub (as HF_HUB_OFFLINE=1)
    tokenizer_name: str | None = None  # "gpt2", a tokenizer directory or Hub id; default: embedded GPT-2 BPE

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(unknown)}")
        config = cls(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
        if self.max_batch_size <= 0:
            raise ValueError(f"max_batch_size must be positive, got {self.max_batch_size}")
        if self.prefill_max_batch_size is not None and self.prefill_max_batch_size <= 0:
            raise ValueError(f"prefill_max_batch_size must be positive, got {self.prefill_max_batch_size}")
        if self.cpu_linear not in ("auto", "onednn", "roseinfer", "torch"):
            raise ValueError(f"cpu_linear must be auto, onednn, roseinfer or torch, got {self.cpu_linear!r}")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"quantization must be None or one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.quantization and (self.device != "cpu" or self.dtype not in (None, "auto", "float32", "fp32")):
            raise ValueError(f"quantization={self.quantization!r} runs on the CPU, in fp32 (leave dtype unset or float32)")
        if self.quantization and self.compile_decode:
            raise ValueError(f"quantization={self.quantization!r} runs eagerly: torch.compile does not trace its kernel yet")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")
