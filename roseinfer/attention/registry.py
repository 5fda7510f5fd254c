"""The attention backends by name, and the default one for a device.

The backends are imported when one is made: the C kernel's module builds
nothing at import, but Triton's import is slow and optional.
"""

from __future__ import annotations

import os

import torch

from roseinfer.attention.base import AttentionBackend

ATTENTION_BACKENDS = ("torch", "cpu", "triton")


def default_attention_backend(device: torch.device) -> str:
    """Triton on CUDA; on a CPU, the fused decode kernel over the torch reference.

    ROSEINFER_ATTENTION_BACKEND names another default for every engine in the process and the servers
    it starts (an engine's own `attention_backend` still wins): "torch" to rule a kernel out while
    debugging, and in the virtual-CUDA notebook test, where Triton's interpreter would be most of the time.
    """
    override = os.environ.get("ROSEINFER_ATTENTION_BACKEND")
    if override:
        if override not in ATTENTION_BACKENDS:
            raise ValueError(f"ROSEINFER_ATTENTION_BACKEND={override!r}; available: {ATTENTION_BACKENDS}")
        return override
    return "triton" if device.type == "cuda" else "cpu"


def make_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        from roseinfer.attention.torch_ref import TorchPagedAttention

        return TorchPagedAttention()
    if name == "cpu":
        from roseinfer.attention.cpu import CpuPagedAttention

        return CpuPagedAttention()
    if name == "triton":
        from roseinfer.kernels.triton import triton_available

        if not triton_available():
            raise ValueError("attention_backend 'triton' needs the triton package (pip install triton)")
        from roseinfer.attention.triton import TritonPagedAttention

        return TritonPagedAttention()
    raise ValueError(f"unknown attention backend {name!r}; available: {ATTENTION_BACKENDS}")
