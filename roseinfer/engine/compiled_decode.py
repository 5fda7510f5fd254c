"""The CPU's counterpart of CUDA graphs: a decode step compiled with torch.compile.

Eagerly, a gpt2 decode step is a few hundred operator calls from Python, each
with its own dispatch and its own pass over small activations: layer norms,
residual adds, the embedding sum. On a GPU, CUDA graphs remove the launches;
on a CPU, inductor's C++ backend compiles the step into a few fused loops
around the projections and the attention, which stay the kernels they are
eagerly (`roseinfer::packed_linear`, `roseinfer::cpu_decode_attention`: opaque
operators, so the packed weights and the KV cache are used in place).

Shapes: the batch size and the block-table width vary from step to step and
are marked dynamic, so one compilation serves every batch (a CPU pays for
padding rows in real FLOPs, so there are no buckets as for CUDA graphs; batch
1 gets its own compilation, as torch specialises sizes 0 and 1). The KV cache
keeps its static shape. Compiling takes seconds to tens of seconds on first
use, which is why the engine compiles only when asked (`compile_decode=True`),
and then at start-up (`warm_up`), before it reports ready.

Steps with prompt tokens run eagerly, as with CUDA graphs.
"""

from __future__ import annotations

import time
import types

import torch

from roseinfer.attention.base import AttentionMetadata
from roseinfer.models.base import CausalLM


class CompiledDecode:
    def __init__(self, model: CausalLM, kv_cache: torch.Tensor) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self._step = torch.compile(_own_copy(self._forward), dynamic=False, fullgraph=True)
        self.compile_seconds = 0.0  # wall time of the calls that compiled (first of each shape class)
        self._compiled_for: set[bool] = set()  # batch == 1, batch > 1: torch compiles each once

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
    ) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=slot_mapping,
            block_tables=block_tables,
            context_lens=context_lens,
            query_start_loc=context_lens,  # unused by a decode-only step
            max_query_len=1,
            max_context_len=0,  # unused: the kernel reads context_lens
        )
        return self.model.compute_logits(self.model(input_ids, positions, kv_cache, meta))

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile both shape classes now (batch 1, batch > 1) rather than in a user's first steps.

        The dummy steps write their K/V into the first slots of block 0, so call this before any
        request holds blocks (the engine does, at start-up). Returns the seconds it took.
        """
        start = time.perf_counter()
        for batch in (1, 2):
            zeros = torch.zeros(batch, dtype=torch.int64, device=self.kv_cache.device)
            meta = AttentionMetadata(
                slot_mapping=torch.arange(batch, device=zeros.device),
                block_tables=torch.zeros(batch, 2, dtype=torch.int32, device=zeros.device),
                context_lens=torch.ones(batch, dtype=torch.int32, device=zeros.device),
                query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=zeros.device),
                max_query_len=1,
                max_context_len=1,
            )
            self.run(zeros, zeros, meta)
        return time.perf_counter() - start

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Logits [batch, vocab] of one decode step (one new token a sequence)."""
        tables = meta.block_tables
        if tables.shape[1] == 1:  # a width of 1 would be one more specialisation, so one more compile
            tables = torch.nn.functional.pad(tables, (0, 1))
        args = (input_ids, positions, self.kv_cache, meta.slot_mapping, tables, meta.context_lens)
        for t in (input_ids, positions, meta.slot_mapping, meta.context_lens, tables):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(tables, 1)
        first = (input_ids.shape[0] == 1) not in self._compiled_for
        start = time.perf_counter()
        logits = self._step(*args)
        if first:
            self._compiled_for.add(input_ids.shape[0] == 1)
            self.compile_seconds += time.perf_counter() - start
        return logits


def _own_copy(method: types.MethodType) -> types.MethodType:
    """The method over a private copy of its code object.

    Dynamo keeps compiled code per code object, guarded on the objects it read: every engine
    compiling the one `_forward` would pile its entries (and references to its weights) onto one
    list, which a process with several engines (tests, notebooks) soon fills to the recompile
    limit. A copy per engine keeps each engine's compilations with it, freed when it is.
    """
    fn = method.__func__
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return types.MethodType(copy, method.__self__)
