"""A decode step's decoder layers in one C call (kernels/cpu/decode_layers.c), for Llama and GPT-2.

At batch 1 a SmolLM2-shaped step runs 30 layers of eleven operations each, and Python pays 5-20 us around
every one: the interpreter's code and data come back into caches the weights just swept. That was about a
quarter of the step. `FusedDecode` hands the whole stack of layers to one C function, which calls the very
kernels the layer-by-layer path calls (the projections' own kernel, pointwise.c, paged_decode.c), in the
same order and with the same thread counts, so a Llama step's logits are bit for bit those of the Python
loop (tests/test_fused_decode.py checks it). GPT-2's loop keeps torch's LayerNorm (one fused operator, faster
a call than a binding to C), so there the two differ by its rounding: within a few ulps, the same greedy tokens.

It takes a step only where every operation of that loop would have been one of those kernels: a decode-only
step on the CPU, every projection on roseinfer's own kernel at this many rows (bf16's kernel, or fp32's where
its probe kept up with oneDNN's), the attention kernel taking the tensors' layout, the pointwise kernels in use, and
torch.compile not tracing. Anything else runs the Python loop, which stays the reference. `enabled = False`
sends every step there (benchmarks/benchmark_decode_layers.py times both).

A family says where its layer's parts are (`Anatomy`): the two norms, the q/k/v and output projections, and
the MLP's two (Llama's gate_up with silu(gate) * up between; GPT-2's c_fc with GELU fused in its kernel).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Anatomy:
    """Where a family's layer keeps its parts (submodule paths), and which norm and MLP it runs."""

    family: int  # decode_layers.c's enum family: 0 Llama (RMSNorm, RoPE, gated SiLU), 1 GPT-2 (LayerNorm, GELU)
    parts: tuple[str, str, str, str, str, str]  # input norm, qkv, output projection, post norm, MLP up, MLP down

    @property
    def norm(self) -> str:
        return "layer_norm" if self.family == 1 else "rms_norm"


LLAMA_LAYER = Anatomy(0, ("input_layernorm", "self_attn.qkv_proj", "self_attn.o_proj", "post_attention_layernorm",
                    "mlp.gate_up_proj", "mlp.down_proj"))
GPT2_LAYER = Anatomy(1, ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"))


class FusedDecode:
    """The decoder layers of a packed model, run by decode_layers.c; built by `for_model`, or None there."""

    def __init__(self, layers: nn.ModuleList, anatomy: Anatomy, config, dtype: torch.dtype, max_rows: int,
                 linear_address: int) -> None:
        self.layers, self.anatomy, self.config, self.dtype, self.max_rows = layers, anatomy, config, dtype, max_rows
        self.lib = load_decode_layers_kernel()
        attention = getattr(load_paged_decode_kernel(), PAGED_DECODE_KERNELS[dtype])
        lib = load_pointwise_kernel()
        self.fns = (ctypes.c_void_p * 6)(linear_address, *(function_address(lib, f"{name}_{SUFFIX[dtype]}")
                                         for name in (anatomy.norm, "rope", "silu_mul", "add")),
                                         ctypes.cast(attention, ctypes.c_void_p).value)
        self._table: tuple[int, torch.Tensor | None] | None = None  # (packed_linear.packs, table) it was read at

    @classmethod
    def for_model(cls, layers: nn.ModuleList, anatomy: Anatomy, config) -> FusedDecode | None:
        """Where every projection runs roseinfer's own kernel (bound at load, one function for all) and the
        kernels load; None otherwise (oneDNN's or F.linear's projections, int8, no compiler)."""
        if not len(layers) or any(lib is None for lib in (
                load_decode_layers_kernel(), load_pointwise_kernel(), load_paged_decode_kernel())):
            return None
        projections = [layer.get_submodule(path) for layer in layers for path in anatomy.parts[1:3] + anatomy.parts[4:]]
        if not all(isinstance(p, PackedLinear) and hasattr(p, "_own") for p in projections):
            return None
        fns = {ctypes.cast(p._own[0], ctypes.c_void_p).value for p in projections}
        dtypes = {p._own[4] for p in projections}
        if len(fns) != 1 or len(dtypes) != 1 or next(iter(dtypes)) not in SUFFIX:
            return None
        # fp32's own kernel takes the rows where it keeps up with oneDNN's (fused_rows); bf16's any. SiLU's kernel
        # stops at its limit.
        rows = min(p.fused_rows if p.kernel != "roseinfer" else pointwise.SILU_MAX_ROWS for p in projections)
        rows = min(rows, pointwise.SILU_MAX_ROWS)
        return cls(layers, anatomy, config, next(iter(dtypes)), rows, next(iter(fns))) if rows else None

    def run(self, x: torch.Tensor, kv_caches: torch.Tensor, meta, backend, cos: torch.Tensor | None = None,
            signed_sin: torch.Tensor | None = None) -> bool:
        """The layers on x [T, n_embd] in place; False (nothing done) where this step is not one the C loop takes.
        cos and signed_sin: Llama's rotations of the step's positions [T, 1, head_dim]."""
        rows, config = x.shape[0], self.config
        heads, kv_heads, head_dim = config.n_head, config.n_kv_head, config.head_dim
        rope = self.anatomy.family == 0
        if not (enabled and pointwise.use_kernel and meta.is_decode_only and 0 < rows <= self.max_rows
                and x.dtype == self.dtype and x.is_cpu and x.is_contiguous() and x.shape[1] == config.n_embd
                and kv_caches.is_contiguous() and isinstance(backend, CpuPagedAttention)
                and backend.kernel is not None and not torch.compiler.is_compiling()):
            return False
        if rope and not all(t.is_contiguous() and t.dtype == x.dtype and t.shape == (rows, 1, head_dim)
                            for t in (cos, signed_sin)):
            return False
        qkv = torch.empty(rows, (heads + 2 * kv_heads) * head_dim, dtype=x.dtype)
        q, k, v = qkv.view(rows, heads + 2 * kv_heads, head_dim).split([heads, kv_heads, kv_heads], dim=1)
        k_cache, v_cache = kv_caches[0, 0], kv_caches[0, 1]
        if not backend._kernel_takes(q, k, v, k_cache, v_cache):  # its verdict on this layout, logged once
            return False
        if self._table is None or self._table[0] != packed_linear.packs:  # weights moved since: read them again
            self._table = packed_linear.packs, self._layer_table()
        table, inter = self._table[1], self.layers[0].get_submodule(self.anatomy.parts[5]).in_features
        if table is None:
            return False
        tables, lens, slots = backend.decode_tables(meta)
        seq_parts, head_group, attention_threads = backend.kernel_pieces(rows, meta.max_context_len, heads, kv_heads,
                                                                         head_dim)
        up = 2 * inter if rope else inter  # Llama's gate and up side by side
        buffers = [x, torch.empty_like(x), qkv, torch.empty(rows, heads * head_dim, dtype=x.dtype),
                   torch.empty(rows, up, dtype=x.dtype), torch.empty(rows, inter if rope else 0, dtype=x.dtype),
                   torch.empty_like(x)]
        num_blocks, block_size = k_cache.shape[:2]
        dims = torch.tensor([len(self.layers), rows, config.n_embd, heads, kv_heads, head_dim, inter, block_size,
                             tables.shape[1], num_blocks * block_size, kv_caches.stride(0) * kv_caches.element_size(),
                             seq_parts, head_group, torch.get_num_threads(), attention_threads,
                             int(x.dtype == torch.bfloat16), self.anatomy.family], dtype=torch.int64)
        step = [cos.data_ptr() if rope else 0, signed_sin.data_ptr() if rope else 0,
                *(t.data_ptr() for t in (slots, tables, lens, k_cache, v_cache))]
        status = self.lib.decode_layers(self.fns, table.data_ptr(), dims.data_ptr(),
                                        (ctypes.c_void_p * 7)(*(t.data_ptr() for t in buffers)),
                                        (ctypes.c_void_p * 7)(*step), config.layer_norm_epsilon,
                                        1.0 / math.sqrt(head_dim))  # the attention modules' own scale
        if status == STATUS_LINEAR:
            raise ValueError(f"a projection's kernel refused a step of {rows} rows")
        if status:
            raise kernel_error(status, slots, tables, lens, k_cache.shape[:2], None)
        return True

    def _layer_table(self) -> torch.Tensor | None:
        """[n_layer, 12] addresses: each norm's weight and bias, each projection's packed weight and bias (0: none).
        None if a norm is not one the kernel reads (another dtype or size), or a projection was packed for other
        widths or activations. Read again after any projection is repacked (load_state_dict); norms load in place."""
        config, gelu = self.config, int(self.anatomy.family == 1)
        embd, q_width = config.n_embd, config.n_head * config.head_dim
        table = []
        for layer in self.layers:
            norm1, qkv, o, norm2, up, down = (layer.get_submodule(path) for path in self.anatomy.parts)
            inter = down.in_features
            if gelu != (up._own[3] == 1) or any(p._own[3] for p in (qkv, o, down)):
                return None
            if (qkv._own[5], o._own[5], up._own[5], down._own[5]) != (embd, q_width, embd, inter):
                return None  # (the loop trusts what each was packed for)
            row = []
            for part in (norm1, qkv, o, norm2, up, down):
                if isinstance(part, PackedLinear):
                    row += [part._own[1], part._own[2] or 0]
                    continue
                bias = getattr(part, "bias", None)
                if gelu != (bias is not None) or any(t.dtype != self.dtype or t.shape != (embd,) or t.stride(0) != 1
                                                     for t in (part.weight, bias) if t is not None):
                    return None
                row += [part.weight.data_ptr(), bias.data_ptr() if bias is not None else 0]
            table += row
        return torch.tensor(table, dtype=torch.int64)
