"""roseinfer's GPT-2: the transformer, computing only the new tokens of each step.

Prefill and decode are the same forward pass: it takes the packed new tokens
of every sequence in the batch and their positions, writes their keys and
values into the paged KV cache, and attends over everything the cache holds
for their sequence. A decode step therefore computes one token a sequence and
never recomputes the prefix.

Parameter names follow Hugging Face's GPT-2 (wte, wpe, h.N.attn.c_attn, ...),
but the projections are `nn.Linear` (HF stores them transposed, as Conv1D):
`state_dict_from_hf` transposes on the way in. The class is the GPT-2 family
of roseinfer.models.registry: it owns that mapping and the config.json one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from roseinfer.attention.base import AttentionBackend, AttentionMetadata
from roseinfer.attention.torch_ref import TorchPagedAttention
from roseinfer.config import GPT2_EOS_TOKEN_ID, GPT2_VOCAB_SIZE, ModelConfig

# HF GPT-2 stores these projections as Conv1D, [in, out]; nn.Linear wants [out, in].
_CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers of HF's implementation (causal mask), not weights.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


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
    model_type = "gpt2"
    mlp_matrices = 2  # c_fc and c_proj

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
        fused = self.__dict__.get("_fused_decode")  # all layers in one C call, where it takes this step
        if fused is None or not fused.run(x, kv_caches, meta, self.attention):
            for layer, block in enumerate(self.h):
                x = block(x, kv_caches[layer], meta, self.attention)
        return self.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits; the LM head shares its weights with the token embedding."""
        packed = self.__dict__.get("_packed_lm_head")
        return packed(hidden) if packed is not None else F.linear(hidden, self.wte.weight)

    def pack_for_cpu(self, cpu_linear: str = "auto") -> None:
        """Store every projection, and a copy of the LM head, in oneDNN's layout (CPU, fp32 or bf16).

        The MLP's GELU moves into its first matrix's kernel. The LM head copy is
        kept out of the module tree (and the state_dict): the embedding still
        needs the dense matrix. Call it after loading weights.
        """
        from roseinfer.models.fused_decode import GPT2_LAYER, FusedDecode
        from roseinfer.models.packed_linear import PackedLinear, pack_linears

        for block in self.h:
            block.mlp.c_fc = PackedLinear.from_linear(block.mlp.c_fc, "gelu_tanh", cpu_linear)
            block.mlp.act = nn.Identity()
        pack_linears(self.h, cpu_linear)
        self.__dict__["_packed_lm_head"] = PackedLinear(self.wte.weight, None, cpu_linear=cpu_linear)
        # Decode steps whose projections all run roseinfer's own kernels: every layer in one C call.
        self.__dict__["_fused_decode"] = FusedDecode.for_model(self.h, GPT2_LAYER, self.config)

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

    # -- the family's Hugging Face mapping (roseinfer.models.base.ModelFamily) ---------------
    @staticmethod
    def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face GPT-2 config.json (unknown keys are ignored)."""
        activation = hf.get("activation_function", "gelu_new")
        if activation not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported GPT-2 activation_function {activation!r}")
        return ModelConfig(
            n_embd=hf.get("n_embd", hf.get("hidden_size", 768)),
            n_layer=hf.get("n_layer", hf.get("num_hidden_layers", 12)),
            n_head=hf.get("n_head", hf.get("num_attention_heads", 12)),
            n_positions=hf.get("n_positions", hf.get("max_position_embeddings", 1024)),
            vocab_size=hf.get("vocab_size", GPT2_VOCAB_SIZE),
            layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-5),
            eos_token_id=hf.get("eos_token_id") or GPT2_EOS_TOKEN_ID,
            family=GPT2.model_type,
        )

    @staticmethod
    def config_to_hf(config: ModelConfig) -> dict[str, Any]:
        """The config.json that HF `GPT2Config` reads back as the same architecture."""
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "activation_function": "gelu_new",
            "n_embd": config.n_embd,
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "n_positions": config.n_positions,
            "n_ctx": config.n_positions,
            "vocab_size": config.vocab_size,
            "layer_norm_epsilon": config.layer_norm_epsilon,
            "bos_token_id": config.eos_token_id,
            "eos_token_id": config.eos_token_id,
            "tie_word_embeddings": True,
        }

    @staticmethod
    def state_dict_from_hf(hf_state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
        """HF GPT-2 names and layouts -> roseinfer's (prefix dropped, Conv1D transposed)."""
        out: dict[str, torch.Tensor] = {}
        lm_head = None
        for name, tensor in hf_state.items():
            name = name.removeprefix("transformer.")
            if name == "lm_head.weight":
                lm_head = tensor
            elif not name.endswith(_IGNORED_SUFFIXES):
                out[name] = (tensor.t() if name.endswith(_CONV1D_SUFFIXES) else tensor).contiguous()
        if lm_head is not None and "wte.weight" in out and not torch.equal(lm_head, out["wte.weight"]):
            raise ValueError("this checkpoint's lm_head is not tied to wte; GPT-2 ties them")
        if lm_head is not None and "wte.weight" not in out:
            out["wte.weight"] = lm_head
        expected = {f"h.{i}." for i in range(config.n_layer)}
        present = {name[: name.index(".", 2) + 1] for name in out if name.startswith("h.")}
        if present != expected:
            raise ValueError(f"checkpoint layers {sorted(present)} do not match n_layer={config.n_layer}")
        return out

    @staticmethod
    def state_dict_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """roseinfer's names and layouts -> HF GPT2LMHeadModel's (fp32, Conv1D transposed back)."""
        hf_state = {}
        for name, tensor in state.items():
            tensor = tensor.detach().cpu().float()
            if name.endswith(_CONV1D_SUFFIXES):
                tensor = tensor.t()
            hf_state[f"transformer.{name}"] = tensor.contiguous()
        return hf_state

    @staticmethod
    def num_parameters(config: ModelConfig) -> int:
        e, v, p = config.n_embd, config.vocab_size, config.n_positions
        per_layer = 12 * e * e + 13 * e  # qkv + proj + 2 MLP matrices, their biases, 2 LayerNorms
        return v * e + p * e + config.n_layer * per_layer + 2 * e  # lm_head is tied to wte
