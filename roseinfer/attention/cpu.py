"""The CPU's paged attention: a fused decode kernel that reads the block table, over the torch reference.

A decode step (one new token a sequence) goes to `kernels/cpu/paged_decode.c`,
which reads each cached key and value once, in place; the torch reference
would first gather every sequence's context into a new tensor and then read
that copy (three passes over the context instead of one). Prefills and mixed
steps keep the reference path, whose cost is dominated by the projections.

The kernel is plain C (`kernels/cpu/paged_decode.c`), compiled at first use by
`kernels/cpu/build.py` and bound in `kernels/cpu/bindings.py`. Its OpenMP loop runs on torch's own worker threads, which are still
spinning from the projection before it. A step big enough to be worth it is
cut by sequences (runs of about equal work, so mixed context lengths keep every thread busy), or at
batch 1 by heads.
Where no compiler is found or the build fails, the backend says so once in
the log and every step takes the reference path: slower, never wrong; a
compiler without OpenMP gives a one-thread kernel.
"""

from __future__ import annotations

import functools
import logging

import torch

from roseinfer.attention.base import AttentionMetadata, write_kv
from roseinfer.attention.torch_ref import TorchPagedAttention
from roseinfer.kernels.cpu.bindings import (
    PAGED_DECODE_KERNELS,
    PAGED_DECODE_SOURCE,
    STATUS_BAD_SLOT,
    STATUS_BAD_TABLE,
    bad_block_table,
    kernel_limits,
    load_paged_decode_kernel,
)

logger = logging.getLogger("roseinfer.attention")

SOURCE = PAGED_DECODE_SOURCE  # what notebook 08 shows
KERNELS = PAGED_DECODE_KERNELS
# Prompts (chunks) up to this many new tokens go through the kernel too (see prefill()); longer
# ones through SDPA, whose tiles beat re-reading the context once a query token.
PREFILL_MAX_QUERY = 128
SPLIT_ABOVE_ROW_TOKENS = 4096  # (sequences x context x heads) below which one thread does the whole step
LAYOUTS_KEPT = 256  # verdicts on tensor layouts a backend remembers (one per step shape in practice)
_refusals_logged: set[str] = set()


def plan_pieces(num_seqs: int, heads: int, head_dim: int, threads: int, max_span: int,
                max_span_heads: int, query_group: int = 1) -> tuple[int, int]:
    """(seq_parts, head_group): how the kernel cuts a step into pieces for `threads` threads.

    `heads` are the cache's KV heads, each read by `query_group` query heads (grouped-query attention;
    1: multi-head). By sequences when there are at least as many as threads; otherwise (batch 1) each
    sequence's KV heads are shared out too. KV heads always come in groups one call can span, their
    query heads included.
    """
    group = max(1, min(heads, max_span_heads // query_group, max_span // (head_dim * query_group)))
    if num_seqs >= threads or num_seqs == 0:
        return threads, group
    per_seq = -(-threads // num_seqs)  # threads a sequence gets
    return num_seqs, min(group, -(-heads // per_seq))


def _shares_token_layout(tensors: list[torch.Tensor]) -> bool:
    """Whether the kernel can read these [B, heads, D] tensors in place: heads and head_dim contiguous,
    and one token stride for all (q, k and v as views of the QKV projection's output are)."""
    q = tensors[0]
    return all(
        t.stride(2) == 1 and t.stride(1) == q.shape[2] and t.stride(0) == q.stride(0)
        and (t.shape[0], t.shape[2]) == (q.shape[0], q.shape[2])
        for t in tensors
    )


def _one_token_layout(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """q (and k, v) as views of one buffer, a token's heads side by side: the layout the kernel reads."""
    if len(tensors) == 1:
        return [tensors[0].contiguous()]
    packed = torch.cat(tensors, dim=1)
    return list(packed.split([t.shape[1] for t in tensors], dim=1))


class CpuPagedAttention(TorchPagedAttention):
    """The torch reference, with decode steps through the fused C kernel (split across threads)."""

    name = "cpu"

    def __init__(self, num_threads: int | None = None) -> None:
        self.kernel = load_paged_decode_kernel()
        # None: torch's thread count, read at every call (torch.set_num_threads may change it after the
        # backend is built, and the projections around the kernel follow it at once).
        self.num_threads = num_threads
        self.max_span, self.max_span_heads, self.max_block_size, self.max_seq_parts = (
            kernel_limits(self.kernel) if self.kernel is not None else (0, 0, 0, 0)
        )
        # layout -> (why the kernel refuses it or None, whether q, k, v share one token layout). Every layer
        # of a step hands over tensors of one layout: checking it costs more than the attention of a short
        # context (about 14 us), so each layout is judged once, and recognised in about 1 us.
        self._verdicts: dict[tuple, tuple[str | None, bool]] = {}

    @property
    def fused(self) -> bool:
        return self.kernel is not None

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, kv_heads, D]
        value: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        fits = self.kernel is not None and self._kernel_takes(query, key, value, k_cache, v_cache)
        if fits and meta.is_decode_only:
            if torch.compiler.is_compiling():  # one opaque operator for torch.compile: see cpu_decode_attention
                return torch.ops.roseinfer.cpu_decode_attention(
                    query, key, value, k_cache, v_cache, meta.slot_mapping, meta.block_tables, meta.context_lens,
                    scale,
                )
            return self.decode(query, k_cache, v_cache, meta, scale, key, value)
        if fits and meta.max_query_len <= PREFILL_MAX_QUERY and not torch.compiler.is_compiling():
            return self.prefill(query, key, value, k_cache, v_cache, meta, scale)
        return super().forward(query, key, value, k_cache, v_cache, meta, scale)

    def _verdict(self, query, key, value, k_cache, v_cache) -> tuple[str | None, bool]:
        """(kernel_refusal's reason or None, _shares_token_layout's answer) for these tensors' layout."""
        tensors = (query, key, value, k_cache, v_cache)
        layout = tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)
        verdict = self._verdicts.get(layout)
        if verdict is None:
            if len(self._verdicts) >= LAYOUTS_KEPT:
                self._verdicts.clear()
            reason = kernel_refusal(*tensors, self.max_block_size, self.max_span)
            verdict = self._verdicts[layout] = (reason, reason is None and _shares_token_layout([query, key, value]))
        return verdict

    def _kernel_takes(self, query, key, value, k_cache, v_cache) -> bool:
        """Whether the kernel can read these tensors as they are; if not, say why in the log (once a reason)."""
        reason = self._verdict(query, key, value, k_cache, v_cache)[0]
        if reason is not None and reason not in _refusals_logged:
            _refusals_logged.add(reason)
            logger.warning("roseinfer: the CPU attention kernel cannot take this step (%s); the torch path does",
                           reason)
        return reason is None

    def decode(
        self,
        query: torch.Tensor,  # [B, H, D]: one token a sequence
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        key: torch.Tensor | None = None,  # [B, H, D]: the new tokens' K/V, written by the kernel
        value: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The fused kernel: attention of each sequence's one query over its cached context.

        With `key` and `value` the step's new K/V are first written at meta.slot_mapping, by the
        kernel; without, they must already be in the cache.
        """
        tables, lens, slots = self.decode_tables(meta)
        return self._attend(query, k_cache, v_cache, tables, lens, meta.max_context_len, scale, key, value, slots)

    @staticmethod
    def decode_tables(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(block tables, context lengths, slots) as the kernel reads them (int32, int32, int64), converted once a
        forward, not once a layer."""
        state = meta.backend_state
        if "cpu_tables" not in state:
            state["cpu_tables"] = meta.block_tables.to(torch.int32).contiguous()
            state["cpu_lens"] = meta.context_lens.to(torch.int32).contiguous()
            state["cpu_slots"] = meta.slot_mapping.to(torch.int64).contiguous()
        return state["cpu_tables"], state["cpu_lens"], state["cpu_slots"]

    def prefill(
        self,
        query: torch.Tensor,  # [T, H, D]: the step's new tokens, packed sequence after sequence
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """A step with prompt tokens through the same kernel: each new token is a query of its own.

        Causal attention means the token at position p sees the cached tokens 0..p of its
        sequence, exactly what a decode step of a sequence whose context ends at p computes. So
        every new token becomes one "sequence" for the kernel, with its own sequence's block
        table and context length p + 1, once the step's keys and values are all in the cache.
        A prompt of n tokens reads n(n+1)/2 cached tokens this way, against SDPA's tiles: cheap
        for the short prompts (up to PREFILL_MAX_QUERY tokens) where SDPA's fixed costs dominate.
        """
        write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        state = meta.backend_state
        if "cpu_token_tables" not in state:
            starts = meta.query_start_loc.to(torch.int64)
            query_lens = starts[1:] - starts[:-1]
            seq = torch.repeat_interleave(torch.arange(meta.num_seqs), query_lens)  # each token's sequence
            # position + 1 = what is cached after the step - the tokens of the step after this one
            lens = meta.context_lens.to(torch.int64)[seq] - (starts[1:][seq] - torch.arange(query.shape[0])) + 1
            state["cpu_token_tables"] = meta.block_tables.to(torch.int32)[seq].contiguous()
            state["cpu_token_lens"] = lens.to(torch.int32)
            state["cpu_token_seqs"] = seq
        return self._attend(query, k_cache, v_cache, state["cpu_token_tables"], state["cpu_token_lens"],
                            meta.max_context_len, scale, row_seqs=state["cpu_token_seqs"])

    def _attend(
        self,
        query: torch.Tensor,  # [S, H, D]: one query token a "sequence"
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        tables: torch.Tensor,  # [S, max_blocks] int32
        lens: torch.Tensor,  # [S] int32: the context each query attends to
        max_context_len: int,
        scale: float,
        key: torch.Tensor | None = None,  # [S, H, D]: new K/V the kernel writes at `slots` first
        value: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
        row_seqs: torch.Tensor | None = None,  # [S]: each row's sequence in the step, where rows are tokens
    ) -> torch.Tensor:
        new = [query] if key is None else [query, key, value]
        shared = self._verdict(query, key, value, k_cache, v_cache)[1] if key is not None else _shares_token_layout(new)
        if not shared:
            new = _one_token_layout(new)
        query = new[0]
        out = torch.empty(query.shape, dtype=query.dtype)
        num_seqs, heads, head_dim = query.shape
        if num_seqs == 0:  # an empty step: nothing to attend, nothing to write
            return out
        kernel = getattr(self.kernel, KERNELS[query.dtype])
        kv_heads = k_cache.shape[2]  # fewer than `heads` under grouped-query attention
        fixed = (heads, kv_heads, head_dim, k_cache.shape[1], tables.shape[1], scale)
        new_kv = (new[1].data_ptr(), new[2].data_ptr(), slots.data_ptr()) if key is not None else (None, None, None)
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        pointers = [query.data_ptr(), *new_kv, query.stride(0), num_slots]
        pointers += [t.data_ptr() for t in (k_cache, v_cache, tables, lens, out)]

        status = kernel(*pointers, num_seqs, *self.kernel_pieces(num_seqs, max_context_len, heads, kv_heads, head_dim), *fixed)
        if status:
            raise kernel_error(status, slots, tables, lens, k_cache.shape[:2], row_seqs)
        return out

    def kernel_pieces(self, num_seqs: int, max_context_len: int, heads: int, kv_heads: int, head_dim: int) -> tuple[int, int, int]:
        """(seq_parts, head_group, threads) for the kernel: how a step's attention is cut, on how many threads."""
        # Waking torch's worker threads for a piece of the step costs a few microseconds: tiny
        # steps (a few short contexts) run on this thread alone.
        work = num_seqs * max_context_len * heads
        threads = self.num_threads or torch.get_num_threads()
        threads = min(threads, self.max_seq_parts) if work >= SPLIT_ABOVE_ROW_TOKENS else 1
        seq_parts, head_group = plan_pieces(num_seqs, kv_heads, head_dim, threads, self.max_span, self.max_span_heads,
                                            heads // kv_heads)
        return seq_parts, head_group, threads


def kernel_refusal(query, key, value, k_cache, v_cache, max_block_size: int, max_span: int) -> str | None:
    """Why the kernel cannot read these tensors in place (None: it can). Its C code trusts every
    shape, stride and dtype it is given, so anything else (a transposed cache, a bf16 cache
    under an fp32 query) must go to the torch path, which handles or refuses it."""
    tensors = (query, key, value, k_cache, v_cache)
    if any(t.device.type != "cpu" for t in tensors):
        return "a tensor is not on the CPU"
    if query.dtype not in KERNELS or any(t.dtype != query.dtype for t in tensors):
        return "dtypes " + ", ".join(str(t.dtype).removeprefix("torch.") for t in tensors) + " (q, k, v, caches)"
    if (query.dim() != 3 or key.dim() != 3 or value.shape != key.shape or key.shape[0] != query.shape[0]
            or key.shape[2] != query.shape[2] or key.shape[1] == 0 or query.shape[1] % key.shape[1]):
        return f"query, key and value shapes {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[2:] != key.shape[1:]:
        return f"cache shapes {tuple(k_cache.shape)}, {tuple(v_cache.shape)} for KV heads x head_dim {key.shape[1:]}"
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return "a KV cache that is not contiguous"
    group = query.shape[1] // key.shape[1]  # the query heads one KV head serves, all in one call
    if k_cache.shape[1] > max_block_size or query.shape[-1] * group > max_span:
        return f"block size {k_cache.shape[1]} or {group} heads of {query.shape[-1]} over the kernel's limits"
    return None


def kernel_error(status: int, slots, tables, lens, cache_blocks: torch.Size, row_seqs) -> Exception:
    """The exception for a kernel's refusal: which sequence, and what was wrong with it."""
    num_blocks, block_size = cache_blocks
    if status & STATUS_BAD_TABLE:
        row, why = bad_block_table(tables, lens, block_size, num_blocks)
        seq = int(row_seqs[row]) if row_seqs is not None and row >= 0 else row
        return IndexError(f"paged attention, sequence {seq} of the step: {why} (none of its cached keys or values was read)")
    if status & STATUS_BAD_SLOT:
        return IndexError(f"a slot in {slots.tolist()} is outside the KV cache ({num_blocks * block_size} slots)")
    return ValueError(f"block size {block_size} is over the kernel's limit (status {status})")


@torch.library.custom_op("roseinfer::cpu_decode_attention", mutates_args=("k_cache", "v_cache"))
def cpu_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """A decode step's KV write and fused attention as one operator, for torch.compile.

    Declaring the two caches as mutated in place lets inductor hand them to
    the kernel as they are. Traced as plain `index_copy_` on a view of the
    cache, the write is functionalized into a copy of the layer's whole cache
    every step; and ctypes calls cannot be traced at all.
    """
    meta = AttentionMetadata(
        slot_mapping, block_tables, context_lens, context_lens, 1, int(context_lens.max())
    )  # query_start_loc is unused by a decode-only step
    return _compiled_backend().decode(query, k_cache, v_cache, meta, scale, key, value)


@cpu_decode_attention.register_fake
def _(query, key, value, k_cache, v_cache, slot_mapping, block_tables, context_lens, scale):
    return query.new_empty(query.shape)  # contiguous, as decode() returns it


@functools.cache
def _compiled_backend() -> CpuPagedAttention:
    return CpuPagedAttention()
