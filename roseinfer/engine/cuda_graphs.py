"""CUDA graphs for the decode step.

A decode step of gpt2 is a few hundred small kernels; launched one by one
from Python, their launch overhead is most of the step. Captured once into a
CUDA graph, the whole step is replayed with one launch.

A graph replays fixed shapes and fixed addresses, so:
- a graph is captured for each batch-size bucket (1, 2, 4, 8, 16, then every
  16 up to the largest batch), and a batch runs in the smallest bucket that
  holds it, the extra rows padded (no KV write: slot -1; a one-token context);
- the inputs live in static device buffers, filled each step from one pinned
  host buffer with a single asynchronous copy;
- attention must not size anything from the data: the Triton decode kernel
  loops over each sequence's context inside the kernel, which the torch
  reference (a gather sized by the longest context) cannot do.

Larger batches and steps with prompt tokens run eagerly. The only host sync
of a step is reading the sampled tokens.

`DecodeGraphs(..., capture=False)` runs the same padded static-buffer path
without capturing; tests use it on CPU to check the padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from roseinfer.model.attention import AttentionMetadata
from roseinfer.model.gpt2 import GPT2


def graph_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 16, then steps of 16, up to (and including) max_batch_size."""
    buckets = [b for b in (1, 2, 4, 8, 16) if b < max_batch_size]
    b = 16
    while b < max_batch_size:
        b += 16
        buckets.append(min(b, max_batch_size))
    if not buckets or buckets[-1] != max_batch_size:
        buckets.append(max_batch_size)
    return sorted(set(buckets))


class DecodeGraphs:
    def __init__(
        self,
        model: GPT2,
        kv_cache: torch.Tensor,
        max_batch_size: int,
        max_blocks_per_seq: int,
        capture: bool = True,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.buckets = graph_buckets(max_batch_size)
        self.max_batch_size = self.buckets[-1]
        self.max_blocks_per_seq = max_blocks_per_seq
        n = self.max_batch_size
        # One pinned host buffer for the per-row integers, one for the block tables.
        pin = self.device.type == "cuda"
        self._host_rows = torch.zeros((4, n), dtype=torch.int64, pin_memory=pin)  # ids, positions, slots, ctx
        self._host_tables = torch.zeros((n, max_blocks_per_seq), dtype=torch.int32, pin_memory=pin)
        self._host_rows_np, self._host_tables_np = self._host_rows.numpy(), self._host_tables.numpy()
        self._rows = torch.zeros((4, n), dtype=torch.int64, device=self.device)
        self._tables = torch.zeros((n, max_blocks_per_seq), dtype=torch.int32, device=self.device)
        self._context_lens = torch.ones(n, dtype=torch.int32, device=self.device)
        self._query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=self.device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self.captured = False
        if capture:
            self.capture()

    def bucket_for(self, batch: int) -> int | None:
        for b in self.buckets:
            if b >= batch:
                return b
        return None

    def _forward(self, bucket: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self._rows[2, :bucket],
            block_tables=self._tables[:bucket],
            context_lens=self._context_lens[:bucket],
            query_start_loc=self._query_start_loc[: bucket + 1],
            max_query_len=1,
            max_context_len=self.max_blocks_per_seq * self.kv_cache.shape[3],  # unused by the kernels
        )
        hidden = self.model(self._rows[0, :bucket], self._rows[1, :bucket], self.kv_cache, meta)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per bucket, largest first, all sharing one memory pool."""
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile the Triton kernels and settle the allocator before capturing
                self._forward(self.max_batch_size)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for bucket in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[bucket] = self._forward(bucket)
            self._graphs[bucket] = graph
        torch.cuda.synchronize(self.device)
        self.captured = True

    def _stage(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        bucket: int,
    ) -> None:
        """Fill the static inputs: real rows first, padding rows after (no write, a one-token context).

        The host side writes through numpy views of the pinned buffers: per row
        that is a list assignment, not a tensor construction.
        """
        batch = len(token_ids)
        rows = self._host_rows_np
        rows[:, :bucket] = 0
        rows[2, :bucket] = -1
        rows[3, :bucket] = 1
        rows[0, :batch] = token_ids
        rows[1, :batch] = positions
        rows[2, :batch] = slots
        rows[3, :batch] = rows[1, :batch] + 1
        tables = self._host_tables_np
        tables[:bucket] = 0
        for i, table in enumerate(block_tables):
            tables[i, : len(table)] = table
        rows, tables = self._host_rows, self._host_tables
        self._rows[:, :bucket].copy_(rows[:, :bucket], non_blocking=True)
        self._tables[:bucket].copy_(tables[:bucket], non_blocking=True)
        self._context_lens[:bucket].copy_(self._rows[3, :bucket])

    @torch.inference_mode()
    def run(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        block_tables: Sequence[Sequence[int]],
    ) -> torch.Tensor:
        """Logits [batch, vocab] of one decode step (batch <= max_batch_size)."""
        batch = len(token_ids)
        bucket = self.bucket_for(batch)
        assert bucket is not None, f"batch {batch} is larger than the largest graph ({self.max_batch_size})"
        self._stage(token_ids, positions, slots, block_tables, bucket)
        if self.captured:
            self._graphs[bucket].replay()
            return self._outputs[bucket][:batch]
        return self._forward(bucket)[:batch]
