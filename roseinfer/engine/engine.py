"""InferenceEngine: the public entry point.

    engine = InferenceEngine.from_pretrained("gpt2")
    outputs = engine.generate(["Hello, my name is"], SamplingParams(max_new_tokens=20))
    for piece in engine.stream_generate("Once upon a time", SamplingParams()):
        print(piece, end="")

The engine owns the model, the KV cache pool (tensor and block bookkeeping)
and the tokenizer. Generation always goes through an `OnlineScheduler` over
the paged KV cache, the same code path the server uses: `generate` is "add all
prompts, step until done". Several schedulers may share one engine (they
allocate disjoint blocks and share cached prefixes), but one thread at a time
steps them: in the server that is the manager's worker.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import torch

from roseinfer.attention.base import default_attention_backend, make_attention_backend
from roseinfer.config import EngineConfig, ModelConfig, resolve_dtype
from roseinfer.detokenizer import TextStream
from roseinfer.engine.block_manager import BlockManager, blocks_for
from roseinfer.engine.runner import BatchEntry, ModelRunner, kv_cache_bytes_per_block
from roseinfer.engine.sequence import GenerationOutput
from roseinfer.models.gpt2 import GPT2
from roseinfer.models.loader import LoadedWeights, load_weights, save_checkpoint
from roseinfer.models.packed_linear import packing_available
from roseinfer.sampling import SamplingParams
from roseinfer.tokenizer import GPT2Tokenizer

logger = logging.getLogger("roseinfer")

CPU_KV_CACHE_BYTES = 1 << 30
CUDA_KV_CACHE_FRACTION = 0.4  # of the memory free after loading the weights


class InferenceEngine:
    def __init__(self, weights: LoadedWeights, config: EngineConfig, tokenizer: GPT2Tokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.weights = weights
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        backend = config.attention_backend or default_attention_backend(self.device)
        _check_backend_runs_here(backend, self.device)
        use_graphs = _resolve_cuda_graph(config.cuda_graph, self.device, backend)
        model = GPT2(weights.config, make_attention_backend(backend))
        model.load_state_dict(weights.state_dict, strict=True)
        model = model.to(device=self.device, dtype=self.dtype).eval()
        if config.packed_cpu_weights and packing_available(self.device, self.dtype):
            model.pack_for_cpu()
        num_blocks = config.num_kv_blocks or self._default_num_blocks(weights.config)
        self.runner = ModelRunner(model, num_blocks, config.block_size, self.device, self.dtype, config.nvtx)
        if config.nvtx and not self.runner.nvtx:
            logger.info("roseinfer: NVTX ranges are a CUDA feature; off on %s", self.device)
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.attention_backend = backend
        if use_graphs:
            self.runner.enable_decode_graphs(config.max_batch_size)
        if config.compile_decode:
            if backend != "cpu" or not model.attention.fused:
                raise ValueError(
                    "compile_decode needs the 'cpu' attention backend with its compiled kernel "
                    "(the torch backend sizes its gather from the data)"
                )
            self.runner.enable_compiled_decode()
            seconds = self.runner.compiled.warm_up()
            logger.info("roseinfer: decode step compiled in %.1f s (batch 1 and batch > 1)", seconds)
        logger.info(
            "roseinfer: %s | %.1fM parameters, %s on %s | KV pool %d blocks x %d tokens | %s attention%s",
            weights.description,
            weights.config.num_parameters() / 1e6,
            str(self.dtype).removeprefix("torch."),
            self.device,
            num_blocks,
            config.block_size,
            backend,
            f", CUDA graphs for batches up to {config.max_batch_size}" if use_graphs else "",
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = "gpt2",
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
        **config: Any,
    ) -> InferenceEngine:
        """Load weights (local dir, checkpoint, local HF cache, Hub, else seeded random) and build the engine.

        `config` takes any `EngineConfig` field: num_kv_blocks, block_size,
        max_batch_size, max_num_batched_tokens, enable_prefix_cache, seed,
        checkpoint_path, hf_model_id, offline, tokenizer_name, attention_backend, ...
        """
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        engine_config = EngineConfig.from_kwargs(device=str(device), dtype=dtype, **config)
        weights = load_weights(
            name_or_path,
            checkpoint_path=engine_config.checkpoint_path,
            hf_model_id=engine_config.hf_model_id,
            seed=engine_config.seed,
            offline=engine_config.offline,
        )
        tokenizer = GPT2Tokenizer.from_pretrained(engine_config.tokenizer_name, offline=engine_config.offline)
        return cls(weights, engine_config, tokenizer)

    def _default_num_blocks(self, model_config: ModelConfig) -> int:
        per_block = kv_cache_bytes_per_block(model_config, self.config.block_size, self.dtype)
        if self.config.kv_cache_memory_gb is not None:
            budget = int(self.config.kv_cache_memory_gb * (1 << 30))
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * CUDA_KV_CACHE_FRACTION)
        else:
            budget = CPU_KV_CACHE_BYTES
        full_context = blocks_for(model_config.n_positions, self.config.block_size)
        # At least one full-length request; never more than a full batch of them could use.
        return max(full_context, min(budget // per_block, self.config.max_batch_size * full_context))

    # -- facts --------------------------------------------------------------------------
    @property
    def model_config(self) -> ModelConfig:
        return self.weights.config

    @property
    def eos_token_id(self) -> int:
        return self.model_config.eos_token_id

    @property
    def max_model_len(self) -> int:
        return self.model_config.n_positions

    @property
    def num_kv_blocks(self) -> int:
        return self.block_manager.num_blocks

    def describe(self) -> dict[str, Any]:
        """What is loaded and how it runs (for logs, /v1/models and result files)."""
        attention = self.runner.model.attention
        return {
            "weights": self.weights.description,
            "weights_source": self.weights.source,
            "random_weights": self.weights.is_random,
            "n_layer": self.model_config.n_layer,
            "n_embd": self.model_config.n_embd,
            "parameters": self.model_config.num_parameters(),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.config.block_size,
            "attention_backend": self.attention_backend,
            # Whether a kernel reads K/V in place through the block table (the cpu backend's C
            # kernel may be missing: no compiler), rather than gathering them first.
            "paged_attention_kernel": getattr(attention, "fused", attention.name == "triton"),
            "cuda_graph": self.runner.graphs is not None,
            "compile_decode": self.runner.compiled is not None,
            "nvtx": self.runner.nvtx,
            "prefill_max_batch_size": self.config.prefill_max_batch_size,
        }

    # -- generation -----------------------------------------------------------------------
    def generate(
        self,
        prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        **scheduler_options: Any,
    ) -> list[GenerationOutput]:
        """Generate for every prompt (text or token ids), batched; outputs in prompt order."""
        from roseinfer.engine.scheduler import OnlineScheduler

        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = _broadcast_params(params, len(prompts))
        scheduler = OnlineScheduler(self, **scheduler_options)
        ids = [
            scheduler.add_request(**_prompt_kwargs(prompt), params=p)
            for prompt, p in zip(prompts, params_list)
        ]
        while scheduler.has_unfinished():
            _check_progress(scheduler, scheduler.step())
        return [scheduler.pop_response(rid) for rid in ids]

    def prompt_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """fp32 logits [len(token_ids), vocab] of every position of one prompt (what HF's model returns).

        For checking the model against another implementation: the prompt's K/V
        go into scratch blocks that are freed before it returns.
        """
        ids = list(token_ids)
        table = self.block_manager.allocate(blocks_for(len(ids), self.block_manager.block_size))
        try:
            entry = BatchEntry(
                token_ids=ids,
                start_pos=0,
                block_table=table,
                sample=False,
                params=SamplingParams(),
                generator=None,
            )
            return self.runner.logits_for([entry])
        finally:
            self.block_manager.free(table)

    def stream_tokens(
        self, prompt: str | list[int], params: SamplingParams | None = None, **scheduler_options: Any
    ) -> Generator[int, None, GenerationOutput]:
        """Yield one request's token ids as they are produced; returns its GenerationOutput."""
        from roseinfer.engine.scheduler import OnlineScheduler

        scheduler = OnlineScheduler(self, **scheduler_options)
        rid = scheduler.add_request(**_prompt_kwargs(prompt), params=params or SamplingParams())
        try:
            while scheduler.has_unfinished():
                produced = scheduler.step()
                _check_progress(scheduler, produced)
                if rid in produced:
                    yield produced[rid]
            return scheduler.pop_response(rid)
        finally:
            scheduler.discard_request(rid)  # frees the blocks if the consumer stops early

    def stream_generate(
        self, prompt: str | list[int], params: SamplingParams | None = None, **scheduler_options: Any
    ) -> Iterator[str]:
        """Yield the text of one generation piece by piece, as tokens are produced."""
        params = params or SamplingParams()
        text = TextStream(self.tokenizer, params.stop)
        with closing(self.stream_tokens(prompt, params, **scheduler_options)) as tokens:
            for token in tokens:
                if params.is_eos_stop(token, self.eos_token_id):
                    continue  # EOS ends the text; it is not part of it
                if piece := text.push(token):
                    yield piece
        if tail := text.finish():
            yield tail

    def save_checkpoint(self, path: str | Path) -> None:
        """Write roseinfer's own checkpoint of the loaded weights (fp32 or the run dtype)."""
        save_checkpoint(path, self.model_config, self.runner.model.state_dict())


def _check_backend_runs_here(backend: str, device: torch.device) -> None:
    from roseinfer.kernels.triton import interpreting

    # Triton compiles for GPUs; on a CPU only its interpreter runs the kernels (exact, and slow).
    if backend == "triton" and device.type != "cuda" and not interpreting():
        raise ValueError(
            f"the triton attention backend needs CUDA; on {device} run it under "
            "TRITON_INTERPRET=1 (slow: for checking the kernels), or use the torch backend"
        )


def _resolve_cuda_graph(requested: bool | None, device: torch.device, backend: str) -> bool:
    if requested is None:
        return device.type == "cuda" and backend == "triton"
    if requested and device.type != "cuda":
        raise ValueError("cuda_graph needs a CUDA device")
    if requested and backend != "triton":
        raise ValueError(
            "cuda_graph needs the triton attention backend (the torch one sizes tensors from the data)"
        )
    return requested


def _prompt_kwargs(prompt: str | list[int]) -> dict[str, Any]:
    return {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": list(prompt)}


def _broadcast_params(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return list(params)


def _check_progress(scheduler: Any, produced: dict[int, int]) -> None:
    # A step that produced nothing and left nothing running admitted no one: the
    # pool is short even though this scheduler holds no block, so another
    # scheduler on the same engine must hold it. Waiting would never end.
    if not produced and scheduler.num_running() == 0 and scheduler.has_unfinished():
        raise RuntimeError("the KV pool is held by another scheduler on this engine")
