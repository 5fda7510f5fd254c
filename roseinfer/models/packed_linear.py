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
measured (notebook 12 measures both, and how much of the gap is the tiles'),
so oneDNN keeps the projections. `ROSEINFER_CPU_LINEAR=onednn` or `=roseinfer` overrides
the choice for every projection built while it is set.

`PackedLinear` holds only the packed weight; its state_dict still reads and
writes ordinary dense tensors under the usual names, so checkpoints and
`load_state_dict` do not see the difference.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from roseinfer.config import amx_bf16_cpu
from roseinfer.kernels.cpu.build import KERNELS_DIR, load_kernel_library

# The number of rows oneDNN tunes the weight layout for. Decode steps have one
# row a running request: 32 is the middle of the batches a CPU serves (the
# layout is valid for any number of rows; only its speed depends on the hint).
PACK_FOR_ROWS = 32

# Output columns per panel of the bf16 kernel's weight layout (NB in linear_bf16.c).
PANEL_COLUMNS = 32

# Fused activations: (oneDNN attribute, algorithm).
ACTIVATIONS = {"none": ("none", ""), "gelu_tanh": ("gelu", "tanh")}


BF16_KERNEL_SOURCE = KERNELS_DIR / "linear_bf16.c"


@functools.cache
def load_bf16_linear_kernel() -> ctypes.CDLL | None:
    """roseinfer's bf16 projection kernel, or None where it cannot run (no AVX512-BF16, no compiler)."""
    lib = load_kernel_library(BF16_KERNEL_SOURCE, "bf16 projection", "oneDNN's kernel")
    if lib is None or not lib.linear_bf16_supported():
        return None
    assert lib.linear_bf16_panel_columns() == PANEL_COLUMNS, "linear_bf16.c and packed_linear.py disagree"
    lib.argmax_bf16.restype = None
    lib.argmax_bf16.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64]
    lib.linear_bf16.restype = ctypes.c_int
    lib.linear_bf16.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_void_p] + [ctypes.c_int64] * 4
    return lib


def bf16_kernel_wanted(dtype: torch.dtype) -> bool:
    """Whether bf16 projections go to roseinfer's kernel (else oneDNN's): where the kernel can run, unless the CPU
    has AMX (oneDNN's kernel is the faster there from a few rows on) or ROSEINFER_CPU_LINEAR names one."""
    choice = os.environ.get("ROSEINFER_CPU_LINEAR", "").lower()
    if dtype != torch.bfloat16 or choice == "onednn" or load_bf16_linear_kernel() is None:
        return False
    return choice == "roseinfer" or not amx_bf16_cpu()


@contextmanager
def cpu_linear(choice: str) -> Iterator[None]:
    """Projections built inside the block use `choice`'s bf16 kernel: "roseinfer" (where it can run) or
    "onednn". How a benchmark or a notebook puts both side by side in one process."""
    if choice not in ("roseinfer", "onednn"):
        raise ValueError(f"cpu_linear: 'roseinfer' or 'onednn', not {choice!r}")
    before = os.environ.get("ROSEINFER_CPU_LINEAR")
    os.environ["ROSEINFER_CPU_LINEAR"] = choice
    try:
        yield
    finally:
        if before is None:
            del os.environ["ROSEINFER_CPU_LINEAR"]
        else:
            os.environ["ROSEINFER_CPU_LINEAR"] = before


def pack_panels(weight: torch.Tensor, columns: int) -> torch.Tensor:
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


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activation: str = "none") -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.activation = activation
        self._attr, self._algorithm = ACTIVATIONS[activation]
        self.kernel = "roseinfer" if bf16_kernel_wanted(weight.dtype) and weight.shape[1] % 2 == 0 else "onednn"
        self._pack(weight, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str = "none") -> PackedLinear:
        return cls(linear.weight, linear.bias, activation)

    def _pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.has_bias = bias is not None
        if self.kernel == "roseinfer":
            self._weight = pack_panels(weight.detach(), PANEL_COLUMNS)
            self._bias = None
            if bias is not None:  # fp32, padded to whole panels: the kernel adds it before rounding
                self._bias = torch.zeros(self._weight.shape[0] * PANEL_COLUMNS)
                self._bias[: self.out_features] = bias.detach().float()
            return
        self._weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_FOR_ROWS)
        self._bias = bias.detach().to(weight.dtype).contiguous() if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if self.kernel == "roseinfer":
            gelu = self.activation == "gelu_tanh"
            if torch.compiler.is_compiling():
                y = torch.ops.roseinfer.bf16_linear(rows, self._weight, self._bias, gelu, self.out_features)
            else:
                y = bf16_linear(rows, self._weight, self._bias, gelu, self.out_features)
        elif torch.compiler.is_compiling():  # opaque to torch.compile: see packed_linear_op
            y = torch.ops.roseinfer.packed_linear(
                rows, self._weight, self._bias, self._attr, self._algorithm, self.out_features
            )
        else:
            y = torch.ops.mkldnn._linear_pointwise(rows, self._weight, self._bias, self._attr, [], self._algorithm)
        return y.view(*shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        if self.kernel == "roseinfer":
            destination[prefix + "weight"] = unpack_panels(self._weight, self.out_features)
            if self.has_bias:
                destination[prefix + "bias"] = self._bias[: self.out_features].to(self._weight.dtype)
            return
        destination[prefix + "weight"] = self._weight.to_dense()
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
        dtype = self._weight.dtype
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


def pack_linears(module: nn.Module) -> int:
    """Replace every nn.Linear below `module` with a PackedLinear; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear.from_linear(child))
            count += 1
        else:
            count += pack_linears(child)
    return count
