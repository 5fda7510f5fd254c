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

`PackedLinear` holds only the packed weight; its state_dict still reads and
writes ordinary dense tensors under the usual names, so checkpoints and
`load_state_dict` do not see the difference.
"""

from __future__ import annotations

import torch
from torch import nn

# The number of rows oneDNN tunes the weight layout for. Decode steps have one
# row a running request: 32 is the middle of the batches a CPU serves (the
# layout is valid for any number of rows; only its speed depends on the hint).
PACK_FOR_ROWS = 32

# Fused activations: (oneDNN attribute, algorithm).
ACTIVATIONS = {"none": ("none", ""), "gelu_tanh": ("gelu", "tanh")}


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
        self._pack(weight, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str = "none") -> PackedLinear:
        return cls(linear.weight, linear.bias, activation)

    def _pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.has_bias = bias is not None
        self._weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_FOR_ROWS)
        self._bias = bias.detach().to(weight.dtype).contiguous() if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if torch.compiler.is_compiling():  # opaque to torch.compile: see packed_linear_op
            y = torch.ops.roseinfer.packed_linear(
                rows, self._weight, self._bias, self._attr, self._algorithm, self.out_features
            )
        else:
            y = torch.ops.mkldnn._linear_pointwise(rows, self._weight, self._bias, self._attr, [], self._algorithm)
        return y.view(*shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
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
            f"activation={self.activation}, oneDNN {str(self._weight.dtype).removeprefix('torch.')}"
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
