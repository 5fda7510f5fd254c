"""InferenceEngine: the public entry point.

    engine = InferenceEngine.from_pretrained("gpt2")
    outputs = engine.generate(["Hello, my name is"], SamplingParams(max_new_tokens=20))
    for piece in engine.stream_generate("Once upon a time", SamplingParams()):
        print(piece, end="")

The engine owns the model, the KV cache pool (tensor and block bookkeeping)
and the tokenizer, and runs the loop every caller shares:

    request = engine.validate(prompt, params)     # tokenize and check, once
    rid = scheduler.add_request(request)           # a policy over the block pool
    engine.step(scheduler)                         # schedule -> run the model -> update

`generate` is "add all prompts, step until done", with each request's text
(its `RequestText`, the owner of its stop strings) fed as tokens arrive; the
server's manager runs the same step on its worker thread. Several schedulers
may share one engine (they allocate disjoint blocks and share cached
prefixes), but one thread at a time steps them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from roseinfer import hub
from roseinfer.attention.registry import default_attention_backend, make_attention_backend
from roseinfer.config import EngineConfig, ModelConfig, resolve_dtype
from roseinfer.detokenizer import RequestText
from roseinfer.engine.batch import BatchEntry
from roseinfer.engine.block_manager import BlockManager, blocks_for
from roseinfer.engine.runner import ModelRunner, kv_cache_bytes_per_block
from roseinfer.engine.scheduler import OnlineScheduler, SchedulerLimits
from roseinfer.engine.sequence import FinishedRequest, GenerationOutput, Request
from roseinfer.errors import InvalidRequestError
from roseinfer.models.loader import LoadedWeights, load_weights, save_checkpoint
from roseinfer.models.packed_linear import packing_available
from roseinfer.models.registry import model_family, num_parameters
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
        # int8 weights are widened to fp32 in the kernel: the activations are fp32 whatever the CPU's default
        self.dtype = torch.float32 if config.quantization else resolve_dtype(config.dtype, self.device)
        graphs_asked = config.cuda_graph and self.device.type == "cuda"  # then only Triton can be captured
        backend = config.attention_backend or ("triton" if graphs_asked else default_attention_backend(self.device))
        _check_backend_runs_here(backend, self.device)
        use_graphs = _resolve_cuda_graph(config.cuda_graph, self.device, backend)
        model = model_family(weights.config.family)(weights.config, make_attention_backend(backend))
        model.load_state_dict(weights.state_dict, strict=True)
        model = model.to(device=self.device, dtype=self.dtype).eval()
        if config.quantization:  # validate() kept it to the CPU and fp32
            model.pack_for_cpu(config.quantization)
        elif config.packed_cpu_weights and packing_available(self.device, self.dtype):
            model.pack_for_cpu(config.cpu_linear)
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
        c = weights.config
        heads = f"{c.n_kv_head} KV heads for {c.n_head} query heads" if c.n_kv_head != c.n_head else f"{c.n_head} heads"
        logger.info(
            "roseinfer: %s | %.1fM parameters, %s on %s | KV pool %d blocks x %d tokens = %d tokens (%s, %d bytes "
            "a token) | %s attention%s",
            weights.description,
            num_parameters(weights.config) / 1e6,
            str(self.dtype).removeprefix("torch."),
            self.device,
            num_blocks,
            config.block_size,
            num_blocks * config.block_size,
            heads,
            kv_cache_bytes_per_block(c, 1, self.dtype),
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
        tokenizer = GPT2Tokenizer.from_pretrained(_tokenizer_name(engine_config, weights), offline=engine_config.offline)
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
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends a request as EOS: end-of-text and the model's end-of-turn ids (Llama 3's <|eot_id|>)."""
        return frozenset((self.model_config.eos_token_id, *self.model_config.stop_token_ids))

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
            "family": self.model_config.family,
            "n_embd": self.model_config.n_embd,
            "n_head": self.model_config.n_head,
            "n_kv_head": self.model_config.n_kv_head,  # K/V heads the cache holds per token
            "head_dim": self.model_config.head_dim,
            "parameters": num_parameters(self.model_config),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.config.block_size,
            # the tokens the KV pool holds: n_head / n_kv_head times more under grouped-query attention
            "kv_cache_tokens": self.num_kv_blocks * self.config.block_size,
            "kv_bytes_per_token": kv_cache_bytes_per_block(self.model_config, 1, self.dtype),
            "attention_backend": self.attention_backend,
            # Whether a kernel reads K/V in place through the block table (the cpu backend's C
            # kernel may be missing: no compiler), rather than gathering them first.
            "paged_attention_kernel": getattr(attention, "fused", attention.name == "triton"),
            "cuda_graph": self.runner.graphs is not None,
            "compile_decode": self.runner.compiled is not None,
            "nvtx": self.runner.nvtx,
            "prefill_max_batch_size": self.config.prefill_max_batch_size,
        }

    # -- requests ------------------------------------------------------------------------
    def validate(
        self,
        prompt: str | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
    ) -> Request:
        """Tokenize and check a request, once; InvalidRequestError if it could never run.

        Reads only configuration, so any thread may call it (the server does, before it
        queues anything). `params.max_new_tokens=None` asks for as many tokens as the
        model's context leaves after the prompt.
        """
        params = params or SamplingParams()
        params.check_for_model(self.model_config.vocab_size)
        token_ids = self._prompt_tokens(prompt, prompt_token_ids)
        if params.max_new_tokens is None:
            params = dataclasses.replace(params, max_new_tokens=self._room_after(len(token_ids)))
        self._check_fits(len(token_ids), params.max_new_tokens)
        return Request(token_ids, params, params.make_generator(self.device), prompt)

    def _prompt_tokens(self, prompt: str | None, prompt_token_ids: list[int] | None) -> list[int]:
        if (prompt is None) == (prompt_token_ids is None):
            raise InvalidRequestError("give exactly one of prompt and prompt_token_ids", "prompt")
        if prompt is not None:
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = list(prompt_token_ids)
            vocab = self.model_config.vocab_size
            bad = [t for t in token_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(
                    f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}", "prompt"
                )
        if not token_ids:
            raise InvalidRequestError("the prompt is empty; the model needs at least one token", "prompt")
        return token_ids

    def _room_after(self, num_prompt_tokens: int) -> int:
        room = self.max_model_len - num_prompt_tokens
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {num_prompt_tokens} tokens, which fills the model's context of "
                f"{self.max_model_len} tokens",
                "prompt",
            )
        return room

    def _check_fits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        limit = self.max_model_len
        if num_prompt_tokens + max_new_tokens > limit:
            raise InvalidRequestError(
                f"the prompt has {num_prompt_tokens} tokens and {max_new_tokens} new tokens were "
                f"asked for: {num_prompt_tokens + max_new_tokens} is more than the model's context "
                f"of {limit} tokens",
                "max_tokens",
            )
        # The last sampled token is never fed back, so its K/V needs no slot.
        needed = blocks_for(num_prompt_tokens + max_new_tokens - 1, self.block_manager.block_size)
        if needed > self.block_manager.num_blocks:
            raise InvalidRequestError(
                f"the request needs {needed} KV blocks but the whole pool has "
                f"{self.block_manager.num_blocks}; it could never run",
                "max_tokens",
            )

    def new_scheduler(self, scheduler_class: type[OnlineScheduler] = OnlineScheduler, **limits: Any) -> OnlineScheduler:
        """A scheduler over this engine's KV pool; `limits` override the EngineConfig's (SchedulerLimits).

        `scheduler_class` takes an earlier policy from roseinfer.history, for the notebooks.
        """
        return scheduler_class(
            self.block_manager, SchedulerLimits.from_config(self.config, **limits), self.eos_token_ids
        )

    def add_request(
        self,
        scheduler: OnlineScheduler,
        prompt: str | None = None,
        prompt_token_ids: list[int] | None = None,
        params: SamplingParams | None = None,
        request_id: int | None = None,
    ) -> int:
        """Validate a request and queue it on `scheduler`; returns its id."""
        return scheduler.add_request(self.validate(prompt, prompt_token_ids, params), request_id)

    def request_text(self, params: SamplingParams) -> RequestText:
        """The text owner of one request (EOS hidden, stop strings honoured)."""
        return RequestText(self.tokenizer, params, self.eos_token_ids)

    # -- stepping --------------------------------------------------------------------------
    def step(self, scheduler: OnlineScheduler) -> dict[int, int]:
        """One forward pass over the scheduler's next batch; {request_id: token} for each token produced."""
        batch = scheduler.schedule()
        if not batch:
            return {}
        sampled = self.runner.execute(batch.entries)
        scheduler.update(batch, sampled)
        return batch.produced(sampled)

    def _step_text(self, scheduler: OnlineScheduler, texts: dict[int, RequestText]) -> dict[int, str]:
        """A step whose tokens go into their requests' texts; a stop string ends its request."""
        produced = self.step(scheduler)
        _check_progress(scheduler, produced)
        pieces = {}
        for rid, token in produced.items():
            text = texts[rid]
            pieces[rid] = text.push(token)
            if text.stopped:
                scheduler.finish_request(rid, "stop")
        return pieces

    # -- generation -----------------------------------------------------------------------
    def generate(
        self,
        prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        **limits: Any,
    ) -> list[GenerationOutput]:
        """Generate for every prompt (text or token ids), batched; outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = _broadcast_params(params, len(prompts))
        # Every request is checked before any runs: a bad one fails the call, not half of it.
        requests = [self.validate(**_prompt_kwargs(p), params=sp) for p, sp in zip(prompts, params_list)]
        scheduler = self.new_scheduler(**limits)
        texts = {scheduler.add_request(r): self.request_text(r.params) for r in requests}
        while scheduler.has_unfinished():
            self._step_text(scheduler, texts)
        return [_with_text(scheduler.pop_response(rid), text) for rid, text in texts.items()]

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

    def stream_generate(
        self, prompt: str | list[int], params: SamplingParams | None = None, **limits: Any
    ) -> Iterator[str]:
        """Yield the text of one generation piece by piece, as tokens are produced."""
        request = self.validate(**_prompt_kwargs(prompt), params=params)
        scheduler = self.new_scheduler(**limits)
        rid = scheduler.add_request(request)
        text = self.request_text(request.params)
        try:
            while scheduler.has_unfinished():
                if piece := self._step_text(scheduler, {rid: text}).get(rid):
                    yield piece
        finally:
            scheduler.discard_request(rid)  # frees the blocks if the consumer stops early
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


def _with_text(finished: FinishedRequest, text: RequestText) -> GenerationOutput:
    text.finish()
    fields = {f.name: getattr(finished, f.name) for f in dataclasses.fields(finished)}
    if text.stopped and finished.finish_reason == "length":
        fields["finish_reason"] = "stop"  # the stop string came with the last allowed token
    return GenerationOutput(**fields, text=text.text)


def _check_progress(scheduler: OnlineScheduler, produced: dict[int, int]) -> None:
    # A step that produced nothing and left nothing running admitted no one: the
    # pool is short even though this scheduler holds no block, so another
    # scheduler on the same engine must hold it. Waiting would never end.
    if not produced and scheduler.num_running() == 0 and scheduler.has_unfinished():
        raise RuntimeError("the KV pool is held by another scheduler on this engine")


def _tokenizer_name(config: EngineConfig, weights: LoadedWeights) -> str | None:
    """The tokenizer asked for; else the checkpoint's own (tokenizer.json beside the weights); else None, the
    embedded GPT-2 BPE, which only the GPT-2 family was trained on (said loudly for any other)."""
    if config.tokenizer_name:
        return config.tokenizer_name
    folder = Path(weights.folder) if weights.folder else None
    if folder and any(all((folder / f).is_file() for f in files) for files in hub.TOKENIZER_FILE_SETS):
        return str(folder)
    if weights.config.family != "gpt2":
        logger.warning(
            "roseinfer: no tokenizer beside the %s weights (%s): using GPT-2's BPE, whose ids mean nothing to this "
            "model; pass --tokenizer-name (a directory or Hub id) for real text", weights.config.family, weights.location)
    return None
