"""The ctypes bindings of the CPU kernels: one place that knows their C signatures and layouts.

`paged_decode.c` (paged attention, used by roseinfer.attention.cpu),
`linear_bf16.c` (the bf16 projection, roseinfer.models.packed_linear, and the
bf16 greedy argmax, roseinfer.sampling), `linear_f32.c` (the fp32
projection of a few rows and the int8-weight one, packed_linear) and
`linear_w8a8.c` (int8 weights and activations), `pointwise.c` (the Llama
block's RMSNorm, RoPE and silu(gate) * up, GPT-2's LayerNorm, roseinfer.models.pointwise) and
`decode_layers.c` (a decode step's layers in one call over the others,
roseinfer.models.fused_decode) are built at first use by `build.py`;
each loader here returns None where its kernel cannot run, and the caller
takes its torch path.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from roseinfer.kernels.cpu.build import KERNELS_DIR, load_kernel_library

PAGED_DECODE_SOURCE = KERNELS_DIR / "paged_decode.c"
BF16_KERNEL_SOURCE = KERNELS_DIR / "linear_bf16.c"
F32_KERNEL_SOURCE = KERNELS_DIR / "linear_f32.c"
W8A8_KERNEL_SOURCE = KERNELS_DIR / "linear_w8a8.c"
POINTWISE_SOURCE = KERNELS_DIR / "pointwise.c"
DECODE_LAYERS_SOURCE = KERNELS_DIR / "decode_layers.c"
# decode_layers.c's argument arrays, in its enums' order: (functions, fields a layer, dims, buffers, step tensors).
DECODE_LAYERS_SHAPE = (6, 12, 17, 7, 7)
PAGED_DECODE_KERNELS = {torch.float32: "paged_decode_f32", torch.bfloat16: "paged_decode_bf16"}
# The status bits paged_decode.c returns (STATUS_* there).
STATUS_LIMITS, STATUS_BAD_SLOT, STATUS_BAD_TABLE = 1, 2, 4
# Output columns per panel of the bf16 kernel's weight layout (NB in linear_bf16.c).
PANEL_COLUMNS = 32


@functools.cache
def load_paged_decode_kernel() -> ctypes.CDLL | None:
    """The compiled attention kernel library, building it if needed; None (and one log line) if it cannot be."""
    lib = load_kernel_library(PAGED_DECODE_SOURCE, "CPU decode attention", "the torch path")
    if lib is None:
        return None
    for name in PAGED_DECODE_KERNELS.values():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = (
            [ctypes.c_void_p] * 4  # q, new k, new v, slots
            + [ctypes.c_int64] * 2  # their token stride, cache slots
            + [ctypes.c_void_p] * 5  # k cache, v cache, block tables, context lens, out
            + [ctypes.c_int64] * 9  # sequences, their parts, head group, threads, heads, KV heads, head_dim, ...
            + [ctypes.c_float]
        )
    for name in ("paged_decode_max_span", "paged_decode_max_span_heads", "paged_decode_max_block_size",
                 "paged_decode_max_seq_parts"):
        getattr(lib, name).restype = ctypes.c_int
    lib.paged_decode_split.restype = None
    lib.paged_decode_split.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def kernel_limits(lib: ctypes.CDLL) -> tuple[int, int, int, int]:
    """(elements, heads) one call may span, the largest cache block it takes, and the most runs of sequences."""
    return (lib.paged_decode_max_span(), lib.paged_decode_max_span_heads(), lib.paged_decode_max_block_size(),
            lib.paged_decode_max_seq_parts())


def split_by_work(lib: ctypes.CDLL, context_lens: list[int], parts: int) -> list[int]:
    """The kernel's cut of a step's sequences into `parts` runs of about equal work (run p: bounds[p]:bounds[p+1])."""
    lens = torch.tensor(context_lens, dtype=torch.int32)
    bounds = torch.empty(parts + 1, dtype=torch.int64)
    lib.paged_decode_split(lens.data_ptr(), len(context_lens), parts, bounds.data_ptr())
    return bounds.tolist()


def bad_block_table(tables: torch.Tensor, lens: torch.Tensor, block_size: int, num_blocks: int) -> tuple[int, str]:
    """(row, why) of the first row of a step the kernel refused (STATUS_BAD_TABLE); run only after a refusal."""
    for row, (table, context) in enumerate(zip(tables.tolist(), lens.tolist())):
        blocks = -(-context // block_size)
        if context < 0 or blocks > len(table):
            return row, f"its context of {context} tokens needs {blocks} blocks, its block-table row holds {len(table)}"
        outside = [b for b in table[:blocks] if not 0 <= b < num_blocks]
        if outside:
            return row, f"block id {outside[0]} in its block table is outside the KV cache's {num_blocks} blocks"
    return -1, "no row found at fault"


@functools.cache
def load_bf16_linear_kernel() -> ctypes.CDLL | None:
    """roseinfer's bf16 projection and argmax, or None where they cannot run (no AVX512-BF16, no compiler)."""
    lib = load_kernel_library(BF16_KERNEL_SOURCE, "bf16 projection", "oneDNN's kernel")
    if lib is None or not lib.linear_bf16_supported():
        return None
    assert lib.linear_bf16_panel_columns() == PANEL_COLUMNS, "linear_bf16.c and bindings.py disagree"
    lib.argmax_bf16.restype = None
    lib.argmax_bf16.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64]
    lib.linear_bf16.restype = ctypes.c_int
    lib.linear_bf16.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_void_p] + [ctypes.c_int64] * 4
    return lib


@functools.cache
def load_f32_linear_kernel() -> ctypes.CDLL | None:
    """roseinfer's fp32 projection for a few rows, or None where it cannot be built (no compiler)."""
    lib = load_kernel_library(F32_KERNEL_SOURCE, "fp32 projection", "oneDNN's kernel or F.linear")
    if lib is None:
        return None
    lib.linear_f32.restype = ctypes.c_int
    lib.linear_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                               ctypes.c_void_p] + [ctypes.c_int64] * 4
    lib.linear_i8.restype = ctypes.c_int
    lib.linear_i8.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int64] * 4
    return lib


@functools.cache
def load_pointwise_kernel() -> ctypes.CDLL | None:
    """pointwise.c's RMSNorm, RoPE, silu(gate) * up and LayerNorm in fp32 and bf16, or None where it cannot be built."""
    lib = load_kernel_library(POINTWISE_SOURCE, "RMSNorm / RoPE / SiLU / LayerNorm", "torch's operators")
    return bind_pointwise(lib) if lib is not None else None


def bind_pointwise(lib: ctypes.CDLL) -> ctypes.CDLL:
    """pointwise.c's signatures on a library built from it (tests build it for other CPU classes too)."""
    rows, pointer, size, real = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for dtype in ("f32", "bf16"):
        for name, argtypes in (
            ("rms_norm", [pointer, size, pointer, real, pointer, rows, size, ctypes.c_int64]),
            ("layer_norm", [pointer, size, pointer, pointer, real, pointer, rows, size, ctypes.c_int64]),
            ("rope", [pointer, size, size, size, pointer, pointer, rows]),
            ("silu_mul", [pointer, size, size, pointer, rows, ctypes.c_int64]),
        ):
            fn = getattr(lib, f"{name}_{dtype}")
            fn.restype, fn.argtypes = None, argtypes
    return lib


@functools.cache
def load_decode_layers_kernel() -> ctypes.CDLL | None:
    """decode_layers.c: every decoder layer of a decode step in one call, or None where it cannot be built."""
    lib = load_kernel_library(DECODE_LAYERS_SOURCE, "decode layers in one call", "a call per operation")
    if lib is None:
        return None
    assert tuple(lib.decode_layers_shape(i) for i in range(5)) == DECODE_LAYERS_SHAPE, \
        "decode_layers.c and bindings.py disagree"
    lib.decode_layers.restype = ctypes.c_int
    lib.decode_layers.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_float] * 2
    return lib


def function_address(lib: ctypes.CDLL, name: str) -> int:
    """Where a library's function lives, to hand it to another kernel (decode_layers.c) as a pointer."""
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def pad_to_panels(values: torch.Tensor | None, columns: int, fill: float = 0.0) -> torch.Tensor | None:
    """A per-output-column vector (a bias, int8's scales) in fp32, padded with `fill` to whole panels of
    `columns`: the kernels read a panel's worth whatever the layer's width. None stays None."""
    if values is None:
        return None
    padded = torch.full((-(-values.shape[0] // columns) * columns,), fill)
    padded[: values.shape[0]] = values.detach().float()
    return padded


def pack_f32_panels(weight: torch.Tensor, columns: int) -> torch.Tensor:
    """[N, K] -> [N/columns, K, columns]: the order linear_f32.c streams a panel of columns in."""
    n, k = weight.shape
    padded = weight.new_zeros(-(-n // columns) * columns, k)
    padded[:n] = weight
    return padded.view(-1, columns, k).permute(0, 2, 1).contiguous()


def unpack_f32_panels(packed: torch.Tensor, n: int) -> torch.Tensor:
    panels, k, columns = packed.shape
    return packed.permute(0, 2, 1).reshape(panels * columns, k)[:n].contiguous()


def f32_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, gelu: bool, n: int) -> torch.Tensor:
    """x [M, K] fp32 through the fp32 panels of an [n, K] weight (bias padded to whole panels)."""
    padded = packed.shape[0] * packed.shape[2]  # the kernel reads whole panels of weight and of bias
    if x.shape[-1] != packed.shape[1] or padded < n or (bias is not None and bias.numel() != padded):
        raise ValueError(f"linear_f32: x {tuple(x.shape)} or a bias of {None if bias is None else bias.numel()} "
                         f"does not fit panels {tuple(packed.shape)} for {n} columns")
    if x.stride(-1) != 1 or x.dtype != torch.float32:
        x = x.float().contiguous()
    y = torch.empty(x.shape[0], n)
    load_f32_linear_kernel().linear_f32(
        x.data_ptr(), x.stride(0), packed.data_ptr(), bias.data_ptr() if bias is not None else None, int(gelu),
        y.data_ptr(), x.shape[0], n, packed.shape[1], torch.get_num_threads(),
    )
    return y


def quantize_i8_panels(weight: torch.Tensor, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] fp32 -> (int8 panels [N/columns, K, columns], fp32 scales padded to whole panels).

    Symmetric, per output channel: scale = max |w| / 127 over the channel's row, w ~ round(w / scale) * scale.
    """
    scale = weight.abs().amax(dim=1).float() / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale, its q are 0
    q = torch.round(weight.float() / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return pack_f32_panels(q, columns), pad_to_panels(scale, columns, fill=1.0)


def i8_linear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, gelu: bool, n: int
) -> torch.Tensor:
    """x [M, K] fp32 through the int8 panels of an [n, K] weight (scale and bias fp32, padded to whole panels)."""
    padded = packed.shape[0] * packed.shape[2]
    if (x.shape[-1] != packed.shape[1] or padded < n or scale.numel() != padded
            or (bias is not None and bias.numel() != padded) or packed.dtype != torch.int8):
        raise ValueError(f"linear_i8: x {tuple(x.shape)} does not fit int8 panels {tuple(packed.shape)} for {n} "
                         "columns (or its scale or bias is not padded to them)")
    if x.stride(-1) != 1 or x.dtype != torch.float32:
        x = x.float().contiguous()
    y = torch.empty(x.shape[0], n)
    status = load_f32_linear_kernel().linear_i8(
        x.data_ptr(), x.stride(0), packed.data_ptr(), scale.data_ptr(), bias.data_ptr() if bias is not None else None,
        int(gelu), y.data_ptr(), x.shape[0], n, packed.shape[1], torch.get_num_threads(),
    )
    if status:
        raise MemoryError(f"linear_i8: no memory for a widened panel of {packed.shape[1]} x {packed.shape[2]}")
    return y


@functools.cache
def load_w8a8_linear_kernel() -> ctypes.CDLL | None:
    """roseinfer's int8 x int8 projection, or None where it cannot be built (no compiler)."""
    lib = load_kernel_library(W8A8_KERNEL_SOURCE, "int8 projection", "no int8 projections")
    return bind_w8a8(lib) if lib is not None else None


def bind_w8a8(lib: ctypes.CDLL) -> ctypes.CDLL:
    """linear_w8a8.c's signatures on a library built from it (tests build it for other CPU classes too)."""
    lib.linear_w8a8.restype = ctypes.c_int
    lib.linear_w8a8.argtypes = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 4 + [ctypes.c_int,
                                ctypes.c_void_p] + [ctypes.c_int64] * 4
    return lib


def quantize_w8a8_panels(weight: torch.Tensor, columns: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] fp32 -> (int8 panels [N/columns, K4, columns, 4], scales, column sums), the last two padded to whole
    panels. The weights are quantized as quantize_i8_panels does; each group of 4 k is one 32-bit lane a column
    (K zero-padded to a multiple of 4); a column's sum of its int8 weights undoes the kernel's shift of x."""
    n, k = weight.shape
    scale = weight.abs().amax(dim=1).float() / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.zeros(-(-n // columns) * columns, -(-k // 4) * 4, dtype=torch.int8)
    q[:n, :k] = torch.round(weight.float() / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    packed = q.view(-1, columns, q.shape[1] // 4, 4).permute(0, 2, 1, 3).contiguous()
    colsum = q.sum(dim=1, dtype=torch.int32)
    return packed, pad_to_panels(scale, columns, fill=1.0), colsum


def unpack_w8a8_panels(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The int8 [n, K4 x 4] weight (K zero-padded to a multiple of 4) of quantize_w8a8_panels' panels."""
    panels, k4, columns, four = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(panels * columns, k4 * four)[:n].contiguous()


def w8a8_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, colsum: torch.Tensor,
                bias: torch.Tensor | None, gelu: bool, n: int, k: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [M, k] fp32 through the int8 panels of an [n, k] weight, x quantized per row in the kernel
    (`lib`: the library built for this CPU, or one bound by bind_w8a8)."""
    panels, k4, columns, four = packed.shape
    padded = panels * columns
    if (x.shape[-1] != k or k4 != -(-k // 4) or four != 4 or padded < n or packed.dtype != torch.int8
            or scale.numel() != padded or colsum.numel() != padded or colsum.dtype != torch.int32
            or (bias is not None and bias.numel() != padded)):
        raise ValueError(f"linear_w8a8: x {tuple(x.shape)} does not fit int8 panels {tuple(packed.shape)} for "
                         f"{n} x {k} (or its scale, column sums or bias are not padded to them)")
    if x.stride(-1) != 1 or x.dtype != torch.float32:
        x = x.float().contiguous()
    y = torch.empty(x.shape[0], n)
    status = (lib or load_w8a8_linear_kernel()).linear_w8a8(
        x.data_ptr(), x.stride(0), packed.data_ptr(), scale.data_ptr(), colsum.data_ptr(),
        bias.data_ptr() if bias is not None else None, int(gelu), y.data_ptr(), x.shape[0], n, k,
        torch.get_num_threads(),
    )
    if status:
        raise MemoryError(f"linear_w8a8: no memory to quantize x {tuple(x.shape)}")
    return y


def pack_panels(weight: torch.Tensor, columns: int = PANEL_COLUMNS) -> torch.Tensor:
    """[N, K] -> [N/columns, K/2, columns, 2]: the order linear_bf16.c streams a panel of columns in."""
    n, k = weight.shape
    padded = weight.new_zeros(-(-n // columns) * columns, k)
    padded[:n] = weight
    return padded.view(-1, columns, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def unpack_panels(packed: torch.Tensor, n: int) -> torch.Tensor:
    panels, pairs, columns, _ = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(panels * columns, pairs * 2)[:n].contiguous()


def bf16_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, gelu: bool, n: int
) -> torch.Tensor:
    """x [M, K] through the packed panels of an [n, K] weight (bias fp32, padded to whole panels)."""
    pairs = packed.shape[1]
    if x.stride(-1) != 1 or x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16).contiguous()
    y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
    status = load_bf16_linear_kernel().linear_bf16(
        x.data_ptr(), x.stride(0), packed.data_ptr(), bias.data_ptr() if bias is not None else None, int(gelu),
        y.data_ptr(), x.shape[0], n, pairs * 2, torch.get_num_threads(),
    )
    if status:
        raise ValueError(f"linear_bf16 failed (status {status}) on x {tuple(x.shape)}")
    return y


def argmax_bf16(logits: torch.Tensor) -> torch.Tensor | None:
    """Each row's argmax of CPU bf16 logits [rows, vocab] by the kernel library, or None where it cannot."""
    if logits.dtype != torch.bfloat16 or logits.device.type != "cpu" or logits.stride(-1) != 1:
        return None
    lib = load_bf16_linear_kernel()
    if lib is None:
        return None
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    lib.argmax_bf16(logits.data_ptr(), logits.shape[0], logits.shape[1], logits.stride(0), out.data_ptr(),
                    torch.get_num_threads())
    return out
