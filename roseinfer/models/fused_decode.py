"""A Llama decode step's decoder layers in one C call (kernels/cpu/decode_layers.c).

At batch 1 a SmolLM2-shaped step runs 30 layers of eleven operations each, and Python pays 5-20 us around
every one: the interpreter's code and data come back into caches the weights just swept. That was about a
quarter of the step. `FusedDecode` hands the whole stack of layers to one C function, which calls the very
kernels the layer-by-layer path calls (the projections' own kernel, pointwise.c, paged_decode.c), in the
same order and with the same thread counts, so the logits are bit for bit those of the Python loop
(tests/test_fused_decode.py checks it).

It takes a step only where every operation of that loop would have been one of those kernels: a decode-only
step on the CPU, every projection on roseinfer's own kernel at this many rows (bf16's kernel, or fp32's at
its few rows), the attention kernel taking the tensors' layout, the pointwise kernels in use, and
torch.compile not tracing. Anything else runs the Python loop, which stays the reference. `enabled = False`
sends every step there (benchmarks/benchmark_llama_step.py times both).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from roseinfer.attention.cpu import CpuPagedAttention, kernel_error
from roseinfer.kernels.cpu.bindings import (
    PAGED_DECODE_KERNELS,
    function_address,
    load_decode_layers_kernel,
    load_paged_decode_kernel,
    load_pointwise_kernel,
)
from roseinfer.models import packed_linear, pointwise
from roseinfer.models.packed_linear import PackedLinear

enabled = True
STATUS_LINEAR = 256  # decode_layers.c: a projection refused its shapes
SUFFIX = pointwise.SUFFIX


def _projections(layer: nn.Module) -> tuple:
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


class FusedDecode:
    """The decoder layers of a packed Llama, run by decode_layers.c; built by `for_model`, or None there."""

    def __init__(self, layers: nn.ModuleList, dtype: torch.dtype, max_rows: int, linear_address: int) -> None:
        self.layers, self.dtype, self.max_rows = layers, dtype, max_rows
        self._table: tuple[int, torch.Tensor | None] | None = None  # (packed_linear.packs, table) it was read at
        self.lib = load_decode_layers_kernel()
        attention = getattr(load_paged_decode_kernel(), PAGED_DECODE_KERNELS[dtype])
        lib = load_pointwise_kernel()
        self.fns = (ctypes.c_void_p * 5)(linear_address, *(function_address(lib, f"{name}_{SUFFIX[dtype]}")
                                         for name in ("rms_norm", "rope", "silu_mul")),
                                         ctypes.cast(attention, ctypes.c_void_p).value)

    @classmethod
    def for_model(cls, layers: nn.ModuleList) -> FusedDecode | None:
        """Where every projection runs roseinfer's own kernel (bound at load, one function for all) and the
        kernels load; None otherwise (oneDNN's or F.linear's projections, int8, no compiler)."""
        if not len(layers) or any(lib is None for lib in (
                load_decode_layers_kernel(), load_pointwise_kernel(), load_paged_decode_kernel())):
            return None
        projections = [p for layer in layers for p in _projections(layer)]
        if not all(isinstance(p, PackedLinear) and hasattr(p, "_own") for p in projections):
            return None
        fns = {ctypes.cast(p._own[0], ctypes.c_void_p).value for p in projections}
        dtypes = {p._own[4] for p in projections}
        if len(fns) != 1 or len(dtypes) != 1 or next(iter(dtypes)) not in SUFFIX:
            return None
        dtype = next(iter(dtypes))
        # fp32's own kernel takes only the few rows below oneDNN's; bf16's any. SiLU's kernel stops at its limit.
        rows = min(p.small_rows if p.kernel != "roseinfer" else pointwise.SILU_MAX_ROWS for p in projections)
        rows = min(rows, pointwise.SILU_MAX_ROWS)
        return cls(layers, dtype, rows, next(iter(fns))) if rows else None

    def run(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, kv_caches: torch.Tensor,
            meta, backend) -> bool:
        """The layers on x [T, n_embd] in place; False (nothing done) where this step is not one the C loop takes."""
        rows = x.shape[0]
        if not (enabled and pointwise.use_kernel and meta.is_decode_only and 0 < rows <= self.max_rows
                and x.dtype == self.dtype and x.is_cpu and x.is_contiguous() and kv_caches.is_contiguous()
                and cos.is_contiguous() and signed_sin.is_contiguous() and cos.dtype == signed_sin.dtype == x.dtype
                and isinstance(backend, CpuPagedAttention) and backend.kernel is not None
                and not torch.compiler.is_compiling()):
            return False
        attn = self.layers[0].self_attn
        heads, kv_heads, head_dim = attn.n_head, attn.n_kv_head, attn.head_dim
        embd, inter = x.shape[1], self.layers[0].mlp.down_proj.in_features
        if cos.shape != (rows, 1, head_dim):
            return False
        qkv = torch.empty(rows, (heads + 2 * kv_heads) * head_dim, dtype=x.dtype)
        q, k, v = qkv.view(rows, heads + 2 * kv_heads, head_dim).split([heads, kv_heads, kv_heads], dim=1)
        k_cache, v_cache = kv_caches[0, 0], kv_caches[0, 1]
        if not backend._kernel_takes(q, k, v, k_cache, v_cache):  # its verdict on this layout, logged once
            return False
        if self._table is None or self._table[0] != packed_linear.packs:  # weights moved since: read them again
            self._table = packed_linear.packs, self._layer_table(embd, heads * head_dim, inter)
        table = self._table[1]
        if table is None:
            return False
        tables, lens, slots = backend.decode_tables(meta)
        seq_parts, head_group, attention_threads = backend.kernel_pieces(rows, meta.max_context_len, heads, kv_heads, head_dim)
        buffers = [x, torch.empty_like(x), qkv, torch.empty(rows, heads * head_dim, dtype=x.dtype),
                   torch.empty(rows, 2 * inter, dtype=x.dtype), torch.empty(rows, inter, dtype=x.dtype),
                   torch.empty_like(x)]
        num_blocks, block_size = k_cache.shape[:2]
        dims = torch.tensor([len(self.layers), rows, embd, heads, kv_heads, head_dim, inter, block_size,
                             tables.shape[1], num_blocks * block_size, kv_caches.stride(0) * kv_caches.element_size(),
                             seq_parts, head_group, torch.get_num_threads(), attention_threads,
                             int(x.dtype == torch.bfloat16)], dtype=torch.int64)
        step = [cos, signed_sin, slots, tables, lens, k_cache, v_cache]
        eps = self.layers[0].input_layernorm.eps
        status = self.lib.decode_layers(self.fns, table.data_ptr(), dims.data_ptr(),
                                        (ctypes.c_void_p * 7)(*(t.data_ptr() for t in buffers)),
                                        (ctypes.c_void_p * 7)(*(t.data_ptr() for t in step)), eps, attn.scale)
        if status == STATUS_LINEAR:
            raise ValueError(f"a projection's kernel refused a step of {rows} rows")
        if status:
            raise kernel_error(status, slots, tables, lens, k_cache.shape[:2], None)
        return True

    def _layer_table(self, embd: int, heads_width: int, inter: int) -> torch.Tensor | None:
        """[n_layer, 7] addresses: input norm, qkv (weight, bias or 0), o, post-attention norm, gate_up, down.
        None if a norm's weight is not one the kernel reads (another dtype or size), or a projection was packed
        for other widths. Read again after any projection is repacked (load_state_dict); norms load in place."""
        table = []
        for layer in self.layers:
            norms = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
            if any(w.dtype != self.dtype or w.shape != (embd,) or w.stride(0) != 1 for w in norms):
                return None
            qkv, o, gate_up, down = (p._own for p in _projections(layer))
            widths = (qkv[5], o[5], gate_up[5], down[5])  # what each was packed for; the loop trusts them
            if widths != (embd, heads_width, embd, inter) or any(p[2] or p[3] for p in (o, gate_up, down)) or qkv[3]:
                return None
            table += [norms[0].data_ptr(), qkv[1], qkv[2] or 0, o[1], norms[1].data_ptr(), gate_up[1], down[1]]
        return torch.tensor(table, dtype=torch.int64)
