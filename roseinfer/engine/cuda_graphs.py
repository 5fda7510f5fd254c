"""CUDA graphs for the decode step.

A decode step of gpt2 is a few hundred small kernels; launched one by one
from Python, their launch overhead is most of the step. Captured once into a
CUDA graph, the whole step is replayed with one launch.

A graph replays fixed shapes and fixed addresses, so:
- a graph is captured for each batch-size bucket (1, 2, 4, 8, 16, then every
  16 up to the largest batch), and a batch runs in the smallest bucket that
  holds it, the extra rows padded (no KV write: slot -1; a one-token context);
- the inputs live in static device buffers, one flat buffer per bucket, filled
  each step from one pinned host buffer with a single asynchronous copy;
- attention must not size anything from the data: the Triton decode kernel
  loops over each sequence's context inside the kernel, which the torch
  reference (a gather sized by the longest context) cannot do.

Larger batches and steps with prompt tokens run eagerly. The only host sync
of a step is reading the sampled tokens.

`DecodeGraphs(..., capture=False)` runs the same padded static-buffer path
without capturing; tests use it on CPU, and under virtual CUDA
(the test harness), to check the padding, the staging copy and the devices.
Before capture a warm-up runs with padding rows only (slot -1), so enabling
graphs on an engine that already holds live or cached K/V leaves them intact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from roseinfer.attention.base import AttentionMetadata
from roseinfer.models.base import CausalLM


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


def can_capture(device: torch.device) -> bool:
    """Graphs are captured on a real CUDA device, by torch's own graph class.

    Under virtual CUDA (the test harness: CPU tensors that report cuda:0) `torch.cuda.CUDAGraph`
    is the harness's stand-in, which refuses to capture, and the same padded static-buffer path
    runs uncaptured. Asking the class, not the harness, keeps the runtime from importing it.
    """
    return device.type == "cuda" and torch.cuda.CUDAGraph.__module__.startswith("torch.")


class DecodeGraphs:
    def __init__(
        self,
        model: CausalLM,
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
        # Staging: per bucket, one flat int64 buffer [ids | positions | slots | context lens | block
        # tables], so a step is one contiguous copy from the pinned host buffer to that bucket's
        # static device buffer (a strided slice would go through an unpinned temporary).
        self._width = 4 + max_blocks_per_seq
        pin = self.device.type == "cuda"
        self._host = torch.zeros(self.max_batch_size * self._width, dtype=torch.int64, pin_memory=pin)
        self._host_np = self._host.numpy()
        self._static = {
            b: torch.zeros(b * self._width, dtype=torch.int64, device=self.device) for b in self.buckets
        }
        self._query_start_loc = torch.arange(self.max_batch_size + 1, dtype=torch.int32, device=self.device)
        for b in self.buckets:  # padding everywhere: a warm-up or capture run writes no K/V
            self._stage([], [], [], [], b)
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

    def _fields(self, flat: torch.Tensor | np.ndarray, bucket: int) -> tuple:
        """(ids, positions, slots, context lens, block tables) views of a bucket's flat buffer."""
        b = bucket
        return (
            flat[:b],
            flat[b : 2 * b],
            flat[2 * b : 3 * b],
            flat[3 * b : 4 * b],
            flat[4 * b :].reshape(b, -1),
        )

    def _forward(self, bucket: int) -> torch.Tensor:
        ids, positions, slots, context_lens, tables = self._fields(self._static[bucket], bucket)
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=tables,
            context_lens=context_lens,
            query_start_loc=self._query_start_loc[: bucket + 1],
            max_query_len=1,
            max_context_len=self.max_blocks_per_seq * self.kv_cache.shape[3],  # unused by the kernels
        )
        hidden = self.model(ids, positions, self.kv_cache, meta)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Compile the Triton kernels and settle the allocator on a side stream, as capture requires.

        The static buffers hold padding rows (slot -1), so this writes nothing into a KV
        cache that may already hold live or prefix-cached blocks.
        """
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(self.max_batch_size)
        torch.cuda.current_stream(self.device).wait_stream(stream)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture one graph per bucket, largest first, all sharing one memory pool."""
        self.warm_up()
        pool = torch.cuda.graph_pool_handle()
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
        """Fill a bucket's static inputs: real rows first, padding rows after (no write, a one-token context).

        The host side writes through numpy views of the pinned buffer: per row
        that is a list assignment, not a tensor construction.
        """
        batch = len(token_ids)
        size = bucket * self._width
        ids, pos, slot, ctx, tables = self._fields(self._host_np[:size], bucket)
        ids[batch:], pos[batch:], slot[batch:], ctx[batch:] = 0, 0, -1, 1
        ids[:batch], pos[:batch], slot[:batch] = token_ids, positions, slots
        ctx[:batch] = pos[:batch] + 1
        tables[:] = 0
        for i, table in enumerate(block_tables):
            tables[i, : len(table)] = table
        self._static[bucket].copy_(self._host[:size], non_blocking=True)

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
