"""What the engine needs from a model family.

A family is one module with one class (GPT2 in gpt2.py) registered in
`registry.py`. The class is the model (`CausalLM`: packed new tokens in,
hidden states out, over the paged KV cache) and owns everything specific to
its architecture: the conversion from and to a Hugging Face config.json and
state dict, its parameter count and its random initialisation. The runner,
the compiled decode step and the CUDA graphs see only this protocol, so a new
family is one file plus one registry line.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from roseinfer.attention.base import AttentionBackend, AttentionMetadata
from roseinfer.config import ModelConfig


class CausalLM(Protocol):
    """A model over the paged KV cache (an nn.Module)."""

    config: ModelConfig
    attention: AttentionBackend

    def __call__(
        self,
        input_ids: torch.Tensor,  # [T] packed new tokens
        positions: torch.Tensor,  # [T] their positions in their sequences
        kv_caches: torch.Tensor,  # [n_layer, 2, num_blocks, block_size, n_kv_head, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states [T, n_embd] after the final norm."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def pack_for_cpu(self, cpu_linear: str = "auto") -> None: ...


class ModelFamily(Protocol):
    """The class of a family: builds models and converts Hugging Face checkpoints."""

    model_type: str  # config.json's "model_type"
    mlp_matrices: int  # weight matrices in one layer's MLP, each n_embd x intermediate_size (roofline's count)

    def __call__(self, config: ModelConfig, attention: AttentionBackend | None = None) -> CausalLM: ...

    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig: ...

    def config_to_hf(self, config: ModelConfig) -> dict[str, Any]: ...

    def state_dict_from_hf(
        self, hf_state: dict[str, torch.Tensor], config: ModelConfig
    ) -> dict[str, torch.Tensor]: ...

    def state_dict_to_hf(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def num_parameters(self, config: ModelConfig) -> int: ...
