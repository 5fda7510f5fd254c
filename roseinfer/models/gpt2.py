"""roseinfer's GPT-2: the transformer, computing only the new tokens of each step.

Prefill and decode are the same forward pass: it takes the packed new tokens
of every sequence in the batch and their positions, writes their keys and
values into the paged KV cache, and attends over everything the cache holds
for their sequence. A decode step therefore computes one token a sequence and
never recomputes the prefix.

Parameter names follow Hugging Face's GPT-2 (wte, wpe, h.N.attn.c_attn, ...),
but the projections are `nn.Linear` (HF stores them transposed, as Conv1D);
the loader transposes on the way in.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from roseinfer.attention.base import AttentionBackend, AttentionMetadata, TorchPagedAttention
from roseinfer.config import ModelConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(
        self,
        x: torch.Tensor,
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, H, D]
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.c_attn(x).view(num_tokens, 3, self.n_head, self.head_dim).unbind(1)
        out = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.c_proj(out.reshape(num_tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's "gelu_new"; Identity once fused into c_fc
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache, meta, backend) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache, meta, backend)
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, config: ModelConfig, attention: AttentionBackend | None = None) -> None:
        super().__init__()
        self.config = config
        self.attention = attention or TorchPagedAttention()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] packed new tokens
        positions: torch.Tensor,  # [T] their positions in their sequences
        kv_caches: torch.Tensor,  # [n_layer, 2, num_blocks, block_size, H, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states [T, n_embd] after the final LayerNorm."""
        x = self.wte(input_ids) + self.wpe(positions)
        for layer, block in enumerate(self.h):
            x = block(x, kv_caches[layer], meta, self.attention)
        return self.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits; the LM head shares its weights with the token embedding."""
        packed = self.__dict__.get("_packed_lm_head")
        return packed(hidden) if packed is not None else F.linear(hidden, self.wte.weight)

    def pack_for_cpu(self) -> None:
        """Store every projection, and a copy of the LM head, in oneDNN's layout (CPU, fp32 or bf16).

        The MLP's GELU moves into its first matrix's kernel. The LM head copy is
        kept out of the module tree (and the state_dict): the embedding still
        needs the dense matrix. Call it after loading weights.
        """
        from roseinfer.models.packed_linear import PackedLinear, pack_linears

        for block in self.h:
            block.mlp.c_fc = PackedLinear.from_linear(block.mlp.c_fc, activation="gelu_tanh")
            block.mlp.act = nn.Identity()
        pack_linears(self.h)
        self.__dict__["_packed_lm_head"] = PackedLinear(self.wte.weight, None)

    @torch.no_grad()
    def init_random_(self, seed: int) -> GPT2:
        """GPT-2's initialisation, reproducible from a seed (whatever the module's device)."""
        gen = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, param in self.named_parameters():
            if name.startswith("ln") or ".ln_" in name:
                value = torch.ones if name.endswith("weight") else torch.zeros
                param.copy_(value(param.shape))
            elif name.endswith("bias"):
                param.zero_()
            else:
                std = residual_std if name.endswith("c_proj.weight") else 0.02
                param.copy_(torch.empty(param.shape).normal_(0.0, std, generator=gen))
        return self
