"""oneDNN-packed linear layers for the CPU, in fp32 or bf16, with the MLP's GELU fused.

On a CPU, `F.linear` with a [out, in] weight goes to a BLAS matmul that is
slow for the shapes decoding produces (a few dozen rows against a wide
weight). `PackedLinear` asks oneDNN once, at load time, to re-lay the weight
out in the blocked format its kernel for this CPU reads fastest
(`_reorder_linear_weight`), then every call is one `_linear_pointwise`:
dense activations in, dense activations out, no per-call conversion, bias
and (for the MLP's first matrix) GELU applied in the same kernel. In bf16 on
a CPU with native bf16 (AVX512-BF16, AMX) the weight reads are halved and the
dot products run on the bf16 units. `benchmarks/benchmark_cpu_linear.py`
measures it per layer shape.

In bf16, on a CPU with AVX512-BF16 and a C compiler, the projections use
roseinfer's own kernel instead (`kernels/cpu/linear_bf16.c`): at the few
dozen rows of a decode step oneDNN's AVX512-BF16 kernel stays well under the
bf16 units' peak, and ours reaches it (`benchmark_bf16_linear.py` shows both,
per shape). Not on a CPU with AMX: there oneDNN's bf16 kernel (which can use
the AMX tiles) was the faster one from a few rows on, on the one such CPU
measured (notebook 11 measures both, and how much of the gap is the tiles'),
so oneDNN keeps the projections.

In fp32, oneDNN's packed kernel pays a fixed cost a call (about 54 us on a
2-core AVX2 EPYC) that a plain `F.linear` does not, and at one row it reads
the weight under the memory's rate: there a batch-1 step was slower packed, a
batch-8 step much faster. A projection of a few rows is a matrix-vector
product, and roseinfer's fp32 kernel (`kernels/cpu/linear_f32.c`) is made for
it: one sequential stream of the weight a thread, in the widest vectors the
CPU has. So the first fp32 projection packed in a process times the three
on one representative shape at a few row counts (`fp32_small_rows`, as the
bf16 choice is made from the CPU): the faster of roseinfer's kernel and
`F.linear` at one row takes the small row counts, up to the first count where
oneDNN's kernel beats it; that projection keeps the small path's weight
(panels, or the dense matrix) beside oneDNN's. Past those rows, a decode step
whose layers all run in one C call (models/fused_decode.py) keeps roseinfer's
kernel for as long as the same probe finds it within FUSED_ROWS_MARGIN of
oneDNN's (`fp32_fused_rows`): the call saves the Python loop's calls between
the projections, so there the kernel need only keep up.

The choice is `EngineConfig.cpu_linear` ("auto", "onednn", "roseinfer",
"torch"), passed to each `PackedLinear`; ROSEINFER_CPU_LINEAR overrides the
config's default when the config is built.

`EngineConfig.quantization` passes its value instead; every projection and
the LM head then keep their weight as int8 with one fp32 scale per output
channel (symmetric, max |w| / 127), so a decode step reads a quarter of
fp32's bytes:
- "int8": activations are quantized too, each row at every call (max |x|),
  and the products are int8 x int8 summed exactly in int32
  (`linear_w8a8.c`: VNNI's vpdpbusd where the CPU has it, vpmaddubsw on
  AVX2), as CTranslate2's and vLLM's int8 do: four times fp32's products an
  instruction. Its exact oracle is that arithmetic written in torch.
- "int8-weight-only": the weight is widened to fp32 in registers as it
  streams (`linear_f32.c`'s `linear_i8`) and the arithmetic stays fp32:
  closer to fp32's answers, bound by the widening's instructions. Its exact
  oracle is the fp32 model with the dequantized weights.
Both save the dequantized weights in `state_dict`.

`PackedLinear` holds only the packed weight; its state_dict still reads and
writes ordinary dense tensors under the usual names, so checkpoints and
`load_state_dict` do not see the difference.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from roseinfer.config import QUANTIZATIONS, amx_bf16_cpu
from roseinfer.kernels.cpu.bindings import (
    PANEL_COLUMNS,
    bf16_linear,
    f32_linear,
    i8_linear,
    load_bf16_linear_kernel,
    load_f32_linear_kernel,
    load_w8a8_linear_kernel,
    pack_f32_panels,
    pack_panels,
    pad_to_panels,
    quantize_i8_panels,
    quantize_w8a8_panels,
    unpack_f32_panels,
    unpack_panels,
    unpack_w8a8_panels,
    w8a8_linear,
)

logger = logging.getLogger("roseinfer.models")

# The number of rows oneDNN tunes the weight layout for. Decode steps have one
# row a running request: 32 is the middle of the batches a CPU serves (the
# layout is valid for any number of rows; only its speed depends on the hint).
PACK_FOR_ROWS = 32

# Fused activations: (oneDNN attribute, algorithm).
ACTIVATIONS = {"none": ("none", ""), "gelu_tanh": ("gelu", "tanh")}

QUANTIZED = QUANTIZATIONS  # the int8 kernels, named as EngineConfig.quantization names them
CPU_LINEAR_CHOICES = ("auto", "onednn", "roseinfer", "torch", *QUANTIZED)
# Row counts at which fp32's F.linear is timed against the packed kernel, and the shape (gpt2's
# qkv, a middle-sized projection): a decode step below 8 rows is where a fixed cost could show.
SMALL_ROWS_PROBE = (1, 2, 4, 8)
PROBE_SHAPE = (2304, 768)
PROBE_REPEATS = 50  # ~0.1 ms a call: the whole probe stays under 0.1 s
# A row count goes to the small path only where it beat oneDNN by this much on the probe: the probe's weight
# sits in the cache, where oneDNN's fixed cost a call weighs most, while a step's weights stream from memory, and
# a win there shrinks in a step. Measured (benchmark_cpu_linear.py): in-cache ratios of 0.78-0.84 became a 4%
# loss in the step (4 rows, AVX2 class); 0.72 stayed a 2% win (8 rows, AVX-512); 0.73 a 28% win (1 row, AVX2).
# A probe on weights cycled through memory was no better: it hid the fixed cost, and called a tie the batch-1
# step the kernel won by 10%.
SMALL_ROWS_MARGIN = 0.75
# One row is held only to beating oneDNN: there the small path also lets a decode step run all its layers in one
# C call (models/fused_decode.py needs roseinfer's kernel on every projection), a gain of its own on top of the
# projections (notebook 09 measures it). Held to 0.75, a CPU whose one-row ratio sits near that margin (a Zen 4 did)
# flipped the choice between processes, and with it whether batch 1 ran the one-call step.
ONE_ROW_MARGIN = 1.0
# Past the small rows, a row count can still run roseinfer's kernel inside the one-call decode step
# (models/fused_decode.py), never in the Python loop: there the call saves the loop's Python calls between the
# projections, so the kernel need only stay near oneDNN's, not beat it. Probed only where the kernel took the
# small rows, and only up to 32 rows: the saving is a fixed cost a step, which the kernel's shortfall outgrows.
# Measured with the probe reaching 64 rows (benchmarks/benchmark_decode_layers.py --batches 1 16 32 64, one-call
# steps over the oneDNN loop): on a Zen 4 (results/cpu/decode_layers.json) 1.30x / 1.18x / 1.12x for SmolLM2 and
# 1.14x / 1.07x / 1.03x for GPT-2 at 16 / 32 / 64 rows; held to the AVX2 class (results/cpu-avx2/) 1.20x / 1.10x /
# 0.98x and 1.12x / 1.01x / 0.97x, with probe ratios there of 0.97 / 1.12 / 1.09: at 64 rows the probe did not see
# the loss coming.
FUSED_ROWS_PROBE = (8, 16, 32)  # (8: where the small rows' stricter margin stopped at 4)
FUSED_ROWS_MARGIN = 1.15
FUSED_PROBE_REPEATS = 40  # calls of 0.3-0.6 ms: the fused probe adds about 0.1 s once a process
packs = 0  # weights (re)packed in this process, by construction or load_state_dict


def bf16_kernel_wanted(dtype: torch.dtype, cpu_linear: str = "auto") -> bool:
    """Whether bf16 projections go to roseinfer's kernel (else oneDNN's): where the kernel can run, unless the CPU
    has AMX (oneDNN's kernel is the faster there from a few rows on) or `cpu_linear` (the config's choice) names one."""
    if dtype != torch.bfloat16 or cpu_linear in ("onednn", "torch") or load_bf16_linear_kernel() is None:
        return False
    return cpu_linear == "roseinfer" or not amx_bf16_cpu()


def choose_kernel(dtype: torch.dtype, in_features: int, cpu_linear: str) -> str:
    """The kernel a projection runs on: "roseinfer" (bf16), "onednn" (packed), "torch" (F.linear), or one of
    QUANTIZED (int8 weights)."""
    if cpu_linear not in CPU_LINEAR_CHOICES:
        raise ValueError(f"cpu_linear must be one of {CPU_LINEAR_CHOICES}, not {cpu_linear!r}")
    if cpu_linear in QUANTIZED:
        loader = load_w8a8_linear_kernel if cpu_linear == "int8" else load_f32_linear_kernel
        if dtype != torch.float32 or loader() is None:
            raise ValueError(f"{cpu_linear} projections need fp32 activations and roseinfer's CPU kernel (a C compiler)")
        return cpu_linear
    if cpu_linear == "torch":
        return "torch"
    return "roseinfer" if bf16_kernel_wanted(dtype, cpu_linear) and in_features % 2 == 0 else "onednn"


def small_rows_choice(timer: Callable[[int], dict[str, float]]) -> tuple[str, int]:
    """(kernel, rows): the small row counts' kernel, and the largest probed count up to which it beat oneDNN's
    packed kernel at every count (0: at none).

    `timer(rows)` gives seconds by kernel: "torch" (F.linear), "onednn" and, where it was built, "roseinfer"
    (linear_f32.c). The small path is the faster of roseinfer's and F.linear at the first count; stopping at
    its first loss to oneDNN (or win by less than SMALL_ROWS_MARGIN; at one row, roseinfer's kernel by less than
    ONE_ROW_MARGIN) keeps the rule one threshold, as a fixed per-call cost predicts.
    """
    first = timer(SMALL_ROWS_PROBE[0])
    kernel = "roseinfer" if first.get("roseinfer", float("inf")) < first["torch"] else "torch"
    threshold = 0
    for rows in SMALL_ROWS_PROBE:
        seconds = first if rows == SMALL_ROWS_PROBE[0] else timer(rows)
        margin = ONE_ROW_MARGIN if rows == 1 and kernel == "roseinfer" else SMALL_ROWS_MARGIN
        if seconds[kernel] >= margin * seconds["onednn"]:
            break
        threshold = rows
    return kernel, threshold


def _time_fp32_linears(rows: int, repeats: int = PROBE_REPEATS, with_torch: bool = True) -> dict[str, float]:
    """Median seconds of F.linear (unless not `with_torch`), the packed oneDNN call and (where built) roseinfer's
    fp32 kernel on PROBE_SHAPE, interleaved."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(PROBE_SHAPE, generator=gen)
    x = torch.randn(rows, PROBE_SHAPE[1], generator=gen)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_FOR_ROWS)
    calls = {"torch": lambda: F.linear(x, weight)} if with_torch else {}
    calls["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    lib = load_f32_linear_kernel()
    if lib is not None:
        panels = pack_f32_panels(weight, lib.linear_f32_panel_columns())
        calls["roseinfer"] = lambda: f32_linear(x, panels, None, False, PROBE_SHAPE[0])
    times: dict[str, list[float]] = {name: [] for name in calls}
    for repeat in range(repeats + 3):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if repeat >= 3:  # the first calls set up oneDNN's primitive and the caches
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(spent) for name, spent in times.items()}


@functools.cache
def fp32_small_rows() -> tuple[str, int]:
    """(kernel, rows): fp32 projections of up to `rows` rows take `kernel` ("roseinfer" or "torch") on this CPU,
    more rows oneDNN's packed kernel. Measured once a process, at first use."""
    kernel, threshold = small_rows_choice(_time_fp32_linears)
    name = "roseinfer's fp32 kernel" if kernel == "roseinfer" else "F.linear"
    logger.info("roseinfer: fp32 projections of up to %d rows take %s (faster than oneDNN's packed kernel "
                "there on this CPU), more rows the packed kernel", threshold, name)
    return kernel, threshold


def fused_rows_choice(small: tuple[str, int], timer: Callable[[int], dict[str, float]]) -> int:
    """The rows up to which a one-call decode step may run roseinfer's fp32 kernel: the small rows, extended over
    the counts of FUSED_ROWS_PROBE past them, up to the first where the kernel took more than FUSED_ROWS_MARGIN
    times oneDNN's time. Extended only where roseinfer's kernel took the small rows (`small`, from
    small_rows_choice)."""
    kernel, rows = small
    if kernel != "roseinfer" or not rows:
        return rows
    for count in (count for count in FUSED_ROWS_PROBE if count > rows):
        seconds = timer(count)
        if seconds["roseinfer"] > FUSED_ROWS_MARGIN * seconds["onednn"]:
            break
        rows = count
    return rows


@functools.cache
def fp32_fused_rows() -> int:
    """fp32 decode steps of up to this many rows may run all their layers on roseinfer's kernel in one C call
    (models/fused_decode.py), on this CPU. Measured once a process, after fp32_small_rows."""
    small = fp32_small_rows()

    def timer(count: int) -> dict[str, float]:
        seconds = _time_fp32_linears(count, FUSED_PROBE_REPEATS, with_torch=False)
        fused_probe_ratios[count] = seconds["roseinfer"] / seconds["onednn"]
        return seconds

    rows = fused_rows_choice(small, timer)
    if fused_probe_ratios:
        logger.info("roseinfer: fp32 decode steps of up to %d rows run in one C call on roseinfer's fp32 kernel "
                    "(its time over oneDNN's on the probe: %s; the limit %.2f)", rows,
                    ", ".join(f"{n} rows {r:.2f}" for n, r in fused_probe_ratios.items()), FUSED_ROWS_MARGIN)
    return rows


fused_probe_ratios: dict[int, float] = {}  # rows -> roseinfer's kernel's time over oneDNN's, as fp32_fused_rows measured


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    """A projection on the CPU kernel `cpu_linear` picks (see choose_kernel), its weight in that kernel's layout."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, activation: str = "none", cpu_linear: str = "auto"
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.activation = activation
        self._attr, self._algorithm = ACTIVATIONS[activation]
        self.kernel = choose_kernel(weight.dtype, self.in_features, cpu_linear)
        # fp32 on oneDNN: row counts up to small_rows take small_kernel (see fp32_small_rows), and a one-call
        # decode step of up to fused_rows rows takes roseinfer's kernel (see fp32_fused_rows).
        self.small_kernel, self.small_rows = fp32_small_rows() if self.kernel == "onednn" \
            and weight.dtype == torch.float32 and cpu_linear in ("auto", "roseinfer") else ("torch", 0)
        self.fused_rows = self.small_rows
        if self.small_kernel == "roseinfer" and self.small_rows:
            self.fused_rows = max(self.small_rows, fp32_fused_rows())
        self._pack(weight, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str = "none", cpu_linear: str = "auto") -> PackedLinear:
        return cls(linear.weight, linear.bias, activation, cpu_linear)

    def _pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        global packs
        packs += 1  # (models/fused_decode.py keeps weight addresses until the next pack)
        self.has_bias = bias is not None
        small_torch = self.small_rows and self.small_kernel == "torch"
        # The dense weight, kept only where F.linear reads it. A view, not a copy: for the LM head it is
        # the embedding's own matrix; for a projection, the tensor it was built from.
        self._dense = weight.detach() if self.kernel == "torch" or small_torch else None
        self._panels = self._panel_bias = None  # roseinfer's fp32 kernel's layout, where it takes the small rows
        if self.kernel == "int8":
            columns = load_w8a8_linear_kernel().linear_w8a8_panel_columns()
            self._weight, self._scale, self._colsum = quantize_w8a8_panels(weight.detach(), columns)
            self._bias = pad_to_panels(bias, columns)
            return
        if self.kernel == "int8-weight-only":
            columns = load_f32_linear_kernel().linear_f32_panel_columns()
            self._weight, self._scale = quantize_i8_panels(weight.detach(), columns)
            self._bias = pad_to_panels(bias, columns)
            return
        if self.small_rows and self.small_kernel == "roseinfer":
            columns = load_f32_linear_kernel().linear_f32_panel_columns()
            self._panels = pack_f32_panels(weight.detach(), columns)
            self._panel_bias = pad_to_panels(bias, columns)
            self._bind_own_kernel(load_f32_linear_kernel().linear_f32, self._panels, self._panel_bias, torch.float32)
        if self.kernel == "roseinfer":
            self._weight = pack_panels(weight.detach(), PANEL_COLUMNS)
            self._bias = pad_to_panels(bias, PANEL_COLUMNS)  # fp32: the kernel adds it before rounding
            self._bind_own_kernel(load_bf16_linear_kernel().linear_bf16, self._weight, self._bias, torch.bfloat16)
            return
        self._bias = bias.detach().to(weight.dtype).contiguous() if bias is not None else None
        if self.kernel == "torch":
            self._weight = self._dense
            return
        self._weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_FOR_ROWS)

    def _bind_own_kernel(self, fn, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        """Keep the call to roseinfer's fp32 or bf16 kernel (one signature) with what is fixed at load time: a
        step at batch 1 is a hundred or more projection calls of tens of microseconds each, so the checks and
        lookups that depend only on the weight are made here, once, not in every call."""
        # The pointers point into this layer's own _panels/_weight and bias, which _pack rebinds with them.
        self._own = (fn, weight.data_ptr(), bias.data_ptr() if bias is not None else None,
                     int(self.activation == "gelu_tanh"), dtype, weight.shape[1] * (2 if dtype == torch.bfloat16 else 1))

    def _own_kernel(self, rows: torch.Tensor) -> torch.Tensor:
        fn, weight, bias, gelu, dtype, k = self._own
        if rows.shape[1] != k:
            raise ValueError(f"{self}: x has {rows.shape[1]} columns, the weight {k}")
        if rows.stride(1) != 1 or rows.dtype != dtype:
            rows = rows.to(dtype).contiguous()
        y = torch.empty(rows.shape[0], self.out_features, dtype=dtype)
        if fn(rows.data_ptr(), rows.stride(0), weight, bias, gelu, y.data_ptr(), rows.shape[0], self.out_features, k,
              torch.get_num_threads()):
            raise MemoryError(f"{self}: the kernel failed on x {tuple(rows.shape)}")
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        compiling = torch.compiler.is_compiling()
        if self.kernel == "roseinfer":
            if compiling:  # one opaque operator for torch.compile: see bf16_linear_op
                y = torch.ops.roseinfer.bf16_linear(rows, self._weight, self._bias, self.activation == "gelu_tanh",
                                                    self.out_features)
            else:
                y = self._own_kernel(rows)
        elif self.kernel in QUANTIZED:
            if compiling:
                raise NotImplementedError("int8 projections are not traced by torch.compile (compile_decode)")
            gelu = self.activation == "gelu_tanh"
            if self.kernel == "int8":
                y = w8a8_linear(rows, self._weight, self._scale, self._colsum, self._bias, gelu, self.out_features,
                                self.in_features)
            else:
                y = i8_linear(rows, self._weight, self._scale, self._bias, gelu, self.out_features)
        elif self._panels is not None and not compiling and rows.shape[0] <= self.small_rows:
            y = self._own_kernel(rows)  # fp32 on roseinfer's kernel, for few rows
        elif self.kernel == "torch" or (not compiling and rows.shape[0] <= self.small_rows):
            y = F.linear(rows, self._dense, self._bias)
            if self.activation == "gelu_tanh":
                y = F.gelu(y, approximate="tanh")
        elif compiling:  # opaque to torch.compile: see packed_linear_op
            y = torch.ops.roseinfer.packed_linear(
                rows, self._weight, self._bias, self._attr, self._algorithm, self.out_features
            )
        else:
            y = torch.ops.mkldnn._linear_pointwise(rows, self._weight, self._bias, self._attr, [], self._algorithm)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        if self.kernel in QUANTIZED:  # the dequantized weights: what the int8 kernels compute with
            unpack = unpack_w8a8_panels if self.kernel == "int8" else unpack_f32_panels
            destination[prefix + "weight"] = unpack(self._weight, self.out_features)[:, : self.in_features].float() \
                * self._scale[: self.out_features, None]
            if self.has_bias:
                destination[prefix + "bias"] = self._bias[: self.out_features]
            return
        if self.kernel == "roseinfer":
            destination[prefix + "weight"] = unpack_panels(self._weight, self.out_features)
            if self.has_bias:
                destination[prefix + "bias"] = self._bias[: self.out_features].to(self._weight.dtype)
            return
        destination[prefix + "weight"] = self._dense if self.kernel == "torch" else self._weight.to_dense()
        if self.has_bias:
            destination[prefix + "bias"] = self._bias

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        weight = state_dict.get(prefix + "weight")
        if weight is None:
            missing.append(prefix + "weight")
            return
        bias = state_dict.get(prefix + "bias")
        if self.has_bias and bias is None:
            missing.append(prefix + "bias")
        dtype = torch.float32 if self.kernel in QUANTIZED else self._weight.dtype  # int8 weights quantize fp32 ones
        self._pack(weight.to(dtype), bias.to(dtype) if self.has_bias and bias is not None else None)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}, "
            f"activation={self.activation}, {self.kernel} {str(self._weight.dtype).removeprefix('torch.')}"
        )


@torch.library.custom_op("roseinfer::packed_linear", mutates_args=())
def packed_linear_op(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, attr: str, algorithm: str, out_features: int
) -> torch.Tensor:
    """A packed projection as one opaque operator, for torch.compile (engine/compiled_decode.py).

    Inductor's own lowering of `_linear_pointwise` only takes weights it packed
    itself (frozen constants); through this operator it calls the kernel on our
    packed weight as is and fuses the layer norms, residual adds and embeddings
    around it. Eager calls skip it: a custom operator's dispatch costs
    microseconds that the eager path would pay on every projection.
    """
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, [], algorithm)


@packed_linear_op.register_fake
def _(x, weight, bias, attr, algorithm, out_features):
    return x.new_empty(x.shape[0], out_features)


@torch.library.custom_op("roseinfer::bf16_linear", mutates_args=())
def bf16_linear_op(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, gelu: bool, n: int) -> torch.Tensor:
    """roseinfer's bf16 projection as one opaque operator, for torch.compile (as packed_linear_op)."""
    return bf16_linear(x, packed, bias, gelu, n)


@bf16_linear_op.register_fake
def _(x, packed, bias, gelu, n):
    return x.new_empty(x.shape[0], n, dtype=torch.bfloat16)


def pack_linears(module: nn.Module, cpu_linear: str = "auto") -> int:
    """Replace every nn.Linear below `module` with a PackedLinear on `cpu_linear`'s kernel; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear.from_linear(child, cpu_linear=cpu_linear))
            count += 1
        else:
            count += pack_linears(child, cpu_linear)
    return count
