"""oneDNN-packed linear layers for fp32 on the CPU.

On a CPU, `F.linear` with a [out, in] weight goes to a BLAS matmul that is
slow for the shapes decoding produces (a few dozen rows against a wide
weight): the LM head, 768 x 50257 in gpt2, takes about twice as long as the
same product through oneDNN with the weight stored in oneDNN's own layout.
`benchmarks/benchmark_cpu_linear.py` measures it per layer shape.

`PackedLinear` holds only the packed weight; its state_dict still reads and
writes ordinary dense tensors under the usual names, so checkpoints and
`load_state_dict` do not see the difference.
"""

from __future__ import annotations

import torch
from torch import nn


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self._pack(weight, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        return cls(linear.weight, linear.bias)

    def _pack(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.has_bias = bias is not None
        self._weight = weight.detach().float().contiguous().to_mkldnn()
        self._bias = (
            (bias if bias is not None else torch.zeros(self.out_features)).detach().float().to_mkldnn()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch._C._nn.mkldnn_linear(
            x.reshape(-1, shape[-1]).contiguous().to_mkldnn(), self._weight, self._bias
        )
        return y.to_dense().view(*shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        destination[prefix + "weight"] = self._weight.to_dense()
        if self.has_bias:
            destination[prefix + "bias"] = self._bias.to_dense()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        weight = state_dict.get(prefix + "weight")
        if weight is None:
            missing.append(prefix + "weight")
            return
        bias = state_dict.get(prefix + "bias")
        if self.has_bias and bias is None:
            missing.append(prefix + "bias")
        self._pack(weight, bias if self.has_bias else None)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}, oneDNN"
        )


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
