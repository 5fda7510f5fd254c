"""ModelRunner: turns one scheduled batch into tensors, runs the model, samples.

It owns the model and the KV cache tensor. The scheduler hands it plain
`BatchEntry` records (which tokens to compute, where their K/V go, whether to
sample after them) and gets back one token per entry that samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch

from roseinfer.attention.base import AttentionMetadata
from roseinfer.config import ModelConfig
from roseinfer.engine.batch import BatchEntry
from roseinfer.models.base import CausalLM
from roseinfer.sampling import Sampler


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layer * block_size * config.n_kv_head * config.head_dim * elem


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        nvtx: bool = False,
    ) -> None:
        self.model = model
        # NVTX ranges name each phase of a step in an Nsight timeline; CUDA builds only.
        self.nvtx = nvtx and device.type == "cuda"
        self.config = model.config
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        c = self.config
        # Zeroed so that never-written slots hold finite values (masked, but 0 * NaN is NaN).
        self.kv_cache = torch.zeros(
            (c.n_layer, 2, num_blocks, block_size, c.n_kv_head, c.head_dim), device=device, dtype=dtype
        )
        self.sampler = Sampler()
        self.graphs = None  # DecodeGraphs, when enabled
        self.compiled = None  # CompiledDecode, when enabled

    def enable_decode_graphs(self, max_batch_size: int, capture: bool | None = None) -> None:
        """Run decode-only steps of up to max_batch_size requests through CUDA graphs.

        capture=None captures where graphs can be captured (a real CUDA device);
        capture=False runs the same padded static-buffer path uncaptured.
        """
        from roseinfer.engine.block_manager import blocks_for
        from roseinfer.engine.cuda_graphs import DecodeGraphs, can_capture

        if not self.model.attention.graph_safe:
            raise ValueError(
                f"decode graphs need an attention backend whose shapes do not depend on the data; "
                f"{self.model.attention.name!r} sizes its gather by the longest context (use 'triton')"
            )
        if capture is None:
            capture = can_capture(self.device)
        max_blocks = blocks_for(self.config.n_positions, self.block_size)
        self.graphs = DecodeGraphs(self.model, self.kv_cache, max_batch_size, max_blocks, capture=capture)

    def enable_compiled_decode(self) -> None:
        """Run decode-only steps through a torch.compile'd step (CPU; compiled at first use)."""
        from roseinfer.engine.compiled_decode import CompiledDecode

        if self.graphs is not None:
            raise ValueError("a compiled decode step and CUDA graphs are alternatives: enable one")
        self.compiled = CompiledDecode(self.model, self.kv_cache)

    def prepare(
        self, batch: Sequence[BatchEntry]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """(input_ids, positions, attention metadata, indices of the rows to sample).

        Built in numpy, then one tensor per array: constructing torch tensors
        from nested Python lists costs more than the rest of a decode step's
        bookkeeping together.
        """
        bs = self.block_size
        lens = np.fromiter((len(e.token_ids) for e in batch), np.int64, len(batch))
        starts = np.fromiter((e.start_pos for e in batch), np.int64, len(batch))
        query_start_loc = np.zeros(len(batch) + 1, np.int64)
        np.cumsum(lens, out=query_start_loc[1:])
        context_lens = starts + lens
        if lens.max() == 1:  # a decode step: one token per sequence
            input_ids = np.fromiter((e.token_ids[0] for e in batch), np.int64, len(batch))
            positions = starts
            slots = np.fromiter(
                (e.block_table[p // bs] * bs + p % bs for e, p in zip(batch, starts.tolist())),
                np.int64,
                len(batch),
            )
        else:
            input_ids = np.fromiter(
                (t for e in batch for t in e.token_ids), np.int64, int(query_start_loc[-1])
            )
            positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts.tolist(), lens.tolist())])
            slots = np.concatenate(
                [
                    np.asarray(e.block_table, np.int64)[np.arange(s, s + n) // bs] * bs
                    + np.arange(s, s + n) % bs
                    for e, s, n in zip(batch, starts.tolist(), lens.tolist())
                ]
            )
        tables = np.zeros((len(batch), max(len(e.block_table) for e in batch)), np.int32)
        for i, e in enumerate(batch):
            tables[i, : len(e.block_table)] = e.block_table
        sample_rows = (query_start_loc[1:] - 1)[[e.sample for e in batch]]

        def to_device(array: np.ndarray, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.from_numpy(array).to(device=self.device, dtype=dtype, non_blocking=True)

        meta = AttentionMetadata(
            slot_mapping=to_device(slots),
            block_tables=to_device(tables, torch.int32),
            context_lens=to_device(context_lens, torch.int32),
            query_start_loc=to_device(query_start_loc, torch.int32),
            max_query_len=int(lens.max()),
            max_context_len=int(context_lens.max()),
        )
        return to_device(input_ids), to_device(positions), meta, to_device(sample_rows)

    def _graphable(self, batch: Sequence[BatchEntry]) -> bool:
        return (
            self.graphs is not None
            and len(batch) <= self.graphs.max_batch_size
            and all(len(e.token_ids) == 1 and e.sample for e in batch)
        )

    def _compilable(self, batch: Sequence[BatchEntry]) -> bool:
        return self.compiled is not None and all(len(e.token_ids) == 1 and e.sample for e in batch)

    def _range(self, name: str) -> AbstractContextManager:
        return torch.cuda.nvtx.range(f"roseinfer.{name}") if self.nvtx else nullcontext()

    def _execute_graph(self, batch: Sequence[BatchEntry]) -> list[int | None]:
        bs = self.block_size
        positions = [e.start_pos for e in batch]
        with self._range("decode_graph"):
            logits = self.graphs.run(
                [e.token_ids[0] for e in batch],
                positions,
                [e.block_table[p // bs] * bs + p % bs for e, p in zip(batch, positions)],
                [e.block_table for e in batch],
            )
        # .tolist() is the step's one host sync; it also frees the pinned staging buffer for the next step.
        with self._range("sample"):
            return self.sampler(logits, [e.params for e in batch], [e.generator for e in batch]).tolist()

    @torch.inference_mode()
    def execute(self, batch: Sequence[BatchEntry]) -> list[int | None]:
        """Run one step; the sampled token of each entry that samples, else None."""
        if self._graphable(batch):
            return self._execute_graph(batch)
        with self._range("prepare"):
            input_ids, positions, meta, sample_rows = self.prepare(batch)
        if self._compilable(batch):
            logits = self.compiled.run(input_ids, positions, meta)
            return self.sampler(logits, [e.params for e in batch], [e.generator for e in batch]).tolist()
        with self._range("forward"):
            hidden = self.model(input_ids, positions, self.kv_cache, meta)
        sampling = [e for e in batch if e.sample]
        if not sampling:
            return [None] * len(batch)
        with self._range("sample"):
            logits = self.model.compute_logits(hidden[sample_rows])
            tokens = iter(
                self.sampler(logits, [e.params for e in sampling], [e.generator for e in sampling]).tolist()
            )
        return [next(tokens) if e.sample else None for e in batch]

    @torch.inference_mode()
    def logits_for(self, batch: Sequence[BatchEntry]) -> torch.Tensor:
        """fp32 logits [T, vocab] of every new token of the batch (tests compare them with HF)."""
        input_ids, positions, meta, _ = self.prepare(batch)
        hidden = self.model(input_ids, positions, self.kv_cache, meta)
        return self.model.compute_logits(hidden).float()
