"""Command-line flags shared by the server, `roseinfer.generate` and the benchmarks."""

from __future__ import annotations

import argparse
from typing import Any

from roseinfer.attention.registry import ATTENTION_BACKENDS
from roseinfer.config import QUANTIZATIONS
from roseinfer.engine.engine import InferenceEngine


def command_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of a `python -m roseinfer.<command>`: its docstring as help, and the model flags."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_args(parser)
    return parser


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument(
        "--model",
        default="gpt2",
        help="preset, local HF directory, or Hub id: local HF cache, else downloaded (default: gpt2)",
    )
    g.add_argument("--checkpoint-path", default=None, help="a roseinfer checkpoint file")
    g.add_argument(
        "--hf-model-id", default=None, help="a Hub id (overrides --model): local HF cache, else downloaded"
    )
    g.add_argument(
        "--offline",
        action="store_true",
        help="never reach the Hub, as HF_HUB_OFFLINE=1 (random weights if nothing local is found)",
    )
    g.add_argument(
        "--tokenizer-name",
        default=None,
        help="gpt2 (the embedded BPE), a tokenizer directory or a Hub id (default: embedded GPT-2 BPE)",
    )
    g.add_argument("--device", default="cpu")
    g.add_argument(
        "--dtype",
        default=None,
        help="float32 | bfloat16 | float16 | auto (default auto: bf16 on CUDA and on CPUs with "
        "native bf16 (AVX512-BF16/AMX), else fp32)",
    )
    g.add_argument(
        "--weights-seed", type=int, default=0, help="seed of the random weights when no checkpoint is found"
    )


def add_engine_args(parser: argparse.ArgumentParser, max_batch_size: int = 64) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--max-batch-size", type=int, default=max_batch_size, help="running requests per step")
    g.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="tokens per step (decodes + prefill chunks)"
    )
    g.add_argument(
        "--num-kv-blocks", type=int, default=None, help="KV pool size in blocks (default: from memory)"
    )
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--no-prefix-cache", action="store_true", help="turn the prefix cache off")
    g.add_argument(
        "--prefill-max-batch-size",
        type=int,
        default=None,
        help="new prompts admitted per step (default: up to --max-batch-size)",
    )
    g.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default=None,
        help="torch (the gather reference, any device), cpu (fused C decode kernel), triton (CUDA kernels); "
        "default: triton on CUDA, cpu on a CPU",
    )
    g.add_argument(
        "--paged-attn",
        action="store_true",
        help="the device's paged-attention kernels: triton on CUDA, the fused C decode kernel (cpu) on a CPU",
    )
    g.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="capture decode steps in CUDA graphs (default: on with CUDA and triton)",
    )
    g.add_argument(
        "--compile-decode",
        action="store_true",
        default=None,
        help="CPU: run decode steps through torch.compile (the CPU's counterpart of CUDA graphs; "
        "compiled at first use, notebook 09)",
    )
    g.add_argument(
        "--nvtx", action="store_true", help="NVTX ranges around each step's phases (CUDA; off on CPU)"
    )
    g.add_argument(
        "--cpu-linear",
        choices=("auto", "onednn", "roseinfer", "torch"),
        default=None,
        help="CPU: the projections' kernel (default: auto, or ROSEINFER_CPU_LINEAR; see EngineConfig.cpu_linear)",
    )
    g.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="CPU: int8 weights, one scale per output channel; int8: activations quantized per row too, int8 "
        "products (VNNI); int8-weight-only: fp32 arithmetic (see EngineConfig.quantization)",
    )


def scheduler_options(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler's limits from the engine flags, for a manager or a benchmark setup."""
    return {
        "max_batch_size": args.max_batch_size,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enable_prefix_cache": not args.no_prefix_cache,
    }


def paged_attention_backend(device: str, requested: str | None = None) -> str:
    """The backend whose kernels read K/V through the block table on this device (the seed's --paged-attn)."""
    import torch

    backend = "triton" if torch.device(device).type == "cuda" else "cpu"
    if requested not in (None, backend):
        raise ValueError(
            f"--paged-attn means the {backend!r} attention backend on {device}, not {requested!r}"
        )
    return backend


def engine_from_args(args: argparse.Namespace) -> InferenceEngine:
    """An engine from the flags above (engine flags are optional)."""
    options = {
        name: getattr(args, name)
        for name in (
            "num_kv_blocks",
            "block_size",
            "max_batch_size",
            "max_num_batched_tokens",
            "prefill_max_batch_size",
        )
        if getattr(args, name, None) is not None
    }
    if hasattr(args, "no_prefix_cache"):
        options["enable_prefix_cache"] = not args.no_prefix_cache
    for name in ("attention_backend", "cuda_graph", "compile_decode", "nvtx", "cpu_linear", "quantization"):
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    if getattr(args, "paged_attn", False):
        options["attention_backend"] = paged_attention_backend(args.device, args.attention_backend)
    return InferenceEngine.from_pretrained(
        args.model,
        device=args.device,
        dtype=args.dtype,
        seed=args.weights_seed,
        checkpoint_path=args.checkpoint_path,
        hf_model_id=args.hf_model_id,
        offline=args.offline,
        tokenizer_name=args.tokenizer_name,
        **options,
    )
