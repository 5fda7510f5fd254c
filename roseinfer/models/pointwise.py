"""The small operations between projections: Llama's RMSNorm, rotary embedding of q and k and silu(gate) * up,
and GPT-2's LayerNorm (for the one-call decode path, models/fused_decode.py).

Each is written twice. The torch functions (`*_reference`) are the definition, in transformers' order of
operations. On a CPU, roseinfer's C kernel (kernels/cpu/pointwise.c) computes the same in one call: at
batch 1 torch's operators spend 10-17 us each on a few kilobytes (dispatch, checks, allocations), and a
SmolLM2-shaped step runs about 150 of them, while a ctypes call costs 2-3 us. RoPE matches the reference
bit for bit; RMSNorm, LayerNorm and SiLU may differ in the last bit (the order of a sum, the exp's polynomial).

The kernel takes a call on the CPU, in fp32 or bf16, on contiguous rows and when torch.compile is not tracing (it fuses the reference itself); anything else takes the reference. Where
the kernel cannot be built, every call does. `use_kernel = False` sends every call to the reference (to
measure what the kernel buys, or to check it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from roseinfer.kernels.cpu.bindings import load_pointwise_kernel

use_kernel = True
# Above this many rows (a prompt's) torch's SiLU, on Sleef's vectorized exp, was the faster (measured on an
# AVX512 EPYC: 250 against 200 us at 300 rows; 38 against 44 us at 32).
SILU_MAX_ROWS = 64
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the C functions' names end in these


def _kernel_for(x: torch.Tensor):
    """The C library where it takes x (a contiguous CPU tensor in fp32 or bf16), else None: the reference runs."""
    if not use_kernel or not x.is_cpu or x.dtype not in SUFFIX or not x.is_contiguous():
        return None
    return None if torch.compiler.is_compiling() else load_pointwise_kernel()


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # torch's one call computes exactly the lines below, in fewer operations
        return F.rms_norm(x, weight.shape, weight, eps)
    # In fp32 whatever the run dtype, then back, as transformers does (bf16 tokens stay comparable).
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight over the last dimension; a new tensor of x's shape."""
    lib = _kernel_for(x)
    if lib is None or x.dim() != 2 or weight.shape != x.shape[1:] or weight.dtype != x.dtype or weight.stride(0) != 1:
        return rms_norm_reference(x, weight, eps)  # (which raises on a weight of another size)
    out = torch.empty_like(x)
    getattr(lib, f"rms_norm_{SUFFIX[x.dtype]}")(x.data_ptr(), x.stride(0), weight.data_ptr(), eps, out.data_ptr(),
                                                 x.shape[0], x.shape[1], torch.get_num_threads())
    return out


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / sqrt(variance + eps) * weight + bias over the last dimension (GPT-2's); a new tensor.

    GPT-2's layer loop keeps torch's nn.LayerNorm: unlike RMSNorm it is one fused operator, a few us faster a
    call than this binding (benchmark_decode_layers.py). The C kernel serves decode_layers.c, which calls it
    without Python; this function is its door for the tests against F.layer_norm."""
    lib = _kernel_for(x)
    if (lib is None or x.dim() != 2 or weight.shape != x.shape[1:] or bias.shape != weight.shape
            or weight.dtype != x.dtype or bias.dtype != x.dtype or weight.stride(0) != 1 or bias.stride(0) != 1):
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)  # the reference (which raises on a wrong size)
    out = torch.empty_like(x)
    getattr(lib, f"layer_norm_{SUFFIX[x.dtype]}")(x.data_ptr(), x.stride(0), weight.data_ptr(), bias.data_ptr(), eps,
                                                   out.data_ptr(), x.shape[0], x.shape[1], torch.get_num_threads())
    return out


def rope_reference_(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's x * cos + cat(-x2, x1) * sin, with its minus folded into the sine's first half
    (`signed_sin`): the same products and sum, bit for bit, in four operations instead of seven."""
    turned = x.roll(x.shape[-1] // 2, dims=-1).mul_(signed_sin)  # cat(x2, x1) * (-sin1, sin2)
    return x.mul_(cos).add_(turned)


def rope_(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE in place on [T, heads, D], Hugging Face's layout: dimension i turns with i + D/2 ("rotate half").

    cos and signed_sin are [T, 1, D], one set of angles a token for all its heads. Written back where x
    lives, so q, k and v stay views of the projection's one buffer.
    """
    lib = _kernel_for(cos)  # x is a view of q and k's heads in the projection's rows: not contiguous
    if (lib is None or x.dim() != 3 or x.shape[2] % 2 or x.stride(2) != 1 or x.stride(1) != x.shape[2]
            or x.dtype != cos.dtype
            or cos.shape != (x.shape[0], 1, x.shape[2]) or signed_sin.shape != cos.shape or signed_sin.dtype != cos.dtype
            or not signed_sin.is_contiguous() or not x.is_cpu):
        return rope_reference_(x, cos, signed_sin)
    getattr(lib, f"rope_{SUFFIX[x.dtype]}")(x.data_ptr(), x.stride(0), x.shape[1], x.shape[2], cos.data_ptr(),
                                             signed_sin.data_ptr(), x.shape[0])
    return x


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """The gated MLP's silu(gate) * up, gate_up [T, 2I] being gate's columns then up's; a new [T, I] tensor."""
    lib = _kernel_for(gate_up)
    if lib is None or gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.shape[0] > SILU_MAX_ROWS:
        return silu_mul_reference(gate_up)
    inter = gate_up.shape[1] // 2
    out = torch.empty(gate_up.shape[0], inter, dtype=gate_up.dtype)
    getattr(lib, f"silu_mul_{SUFFIX[gate_up.dtype]}")(gate_up.data_ptr(), gate_up.stride(0), inter, out.data_ptr(),
                                                      gate_up.shape[0], torch.get_num_threads())
    return out
