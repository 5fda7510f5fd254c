"""roseinfer's Llama family: Llama 2/3, SmolLM2, TinyLlama (`llama`) and Qwen2/2.5 (`qwen2`).

What changes from GPT-2 (roseinfer.models.gpt2), block by block:

- positions are rotations of q and k (RoPE), not a learned table added to the input;
- RMSNorm instead of LayerNorm (no mean, no bias);
- grouped-query attention: `n_kv_head` K/V heads, each shared by `n_head / n_kv_head` query heads, so the KV
  cache holds that many times fewer bytes per token;
- a gated MLP, down(silu(gate(x)) * up(x)), and no biases (Qwen2 keeps them on q, k and v);
- a separate LM head, unless `tie_word_embeddings`.

The step is the same as GPT-2's: packed new tokens in, their K/V written into the paged cache, attention over
the cache. Like GPT-2's c_attn, q, k and v are one projection here (`qkv_proj`) and gate and up another
(`gate_up_proj`): one matrix a step reads instead of three and two. `state_dict_from_hf` concatenates
Hugging Face's separate q_proj/k_proj/v_proj and gate_proj/up_proj on the way in.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from roseinfer.attention.base import AttentionBackend, AttentionMetadata
from roseinfer.attention.torch_ref import TorchPagedAttention
from roseinfer.config import ModelConfig
from roseinfer.models.pointwise import rms_norm, rope_, silu_mul


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """The rotation speed of each pair of a head's dimensions (fp32): theta^(-2i/d), rescaled for `llama3`."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = dict(config.rope_scaling or ())
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (default and llama3 are)")
    # Llama 3.1's context extension: slow (long-wavelength) dimensions are slowed down by `factor`,
    # fast ones kept, the ones between blended, so short contexts see what training saw.
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    blend = (original / wavelength - low) / (high - low)
    blended = (1 - blend) * scaled / factor + blend * scaled
    between = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(between, blended, scaled)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.scale = 1.0 / math.sqrt(config.head_dim)
        q_width, kv_width = config.n_head * config.head_dim, config.n_kv_head * config.head_dim
        self.qkv_proj = nn.Linear(config.n_embd, q_width + 2 * kv_width, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_width, config.n_embd, bias=False)

    def forward(self, x, kv_cache, meta, backend, cos, signed_sin) -> torch.Tensor:
        num_tokens, heads, kv_heads = x.shape[0], self.n_head, self.n_kv_head
        # [T, heads + 2 * kv_heads, D]: each token's q heads, then its k heads, then its v heads.
        qkv = self.qkv_proj(x).view(num_tokens, heads + 2 * kv_heads, self.head_dim)
        rope_(qkv[:, : heads + kv_heads], cos, signed_sin)  # q and k turn together, in place
        q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
        out = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.n_head * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.layer_norm_epsilon)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache, meta, backend, cos, signed_sin) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), kv_cache, meta, backend, cos, signed_sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    model_type = "llama"
    mlp_matrices = 3  # gate, up and down: the gated SiLU MLP
    architecture = "LlamaForCausalLM"

    def __init__(self, config: ModelConfig, attention: AttentionBackend | None = None) -> None:
        super().__init__()
        self.config = config
        self.attention = attention or TorchPagedAttention()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.layer_norm_epsilon)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] packed new tokens
        positions: torch.Tensor,  # [T] their positions in their sequences
        kv_caches: torch.Tensor,  # [n_layer, 2, num_blocks, block_size, n_kv_head, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states [T, n_embd] after the final RMSNorm."""
        x = self.embed_tokens(input_ids)
        # The rotation of each token's position, once a step for every layer (fp32, then the run dtype).
        angles = positions.float()[:, None] * self.inv_freq.float()[None, :]
        cos = torch.cat((angles, angles), dim=-1)[:, None, :].cos().to(x.dtype)  # [T, 1 (heads), D]
        sin = angles.sin()
        signed_sin = torch.cat((-sin, sin), dim=-1)[:, None, :].to(x.dtype)  # rope_'s
        fused = self.__dict__.get("_fused_decode")  # all layers in one C call, where it takes this step
        if fused is None or not fused.run(x, kv_caches, meta, self.attention, cos, signed_sin):
            for layer, block in enumerate(self.layers):
                x = block(x, kv_caches[layer], meta, self.attention, cos, signed_sin)
        return self.norm(x)

    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        packed = self.__dict__.get("_packed_lm_head")
        return packed(hidden) if packed is not None else F.linear(hidden, self.head_weight())

    def pack_for_cpu(self, cpu_linear: str = "auto") -> None:
        """Every projection, and the LM head, in the CPU kernels' layout (see GPT2.pack_for_cpu)."""
        from roseinfer.models.fused_decode import LLAMA_LAYER, FusedDecode
        from roseinfer.models.packed_linear import PackedLinear, pack_linears

        pack_linears(self.layers, cpu_linear)
        self.__dict__["_packed_lm_head"] = PackedLinear(self.head_weight(), None, cpu_linear=cpu_linear)
        # Decode steps whose projections all run roseinfer's own kernels: every layer in one C call.
        self.__dict__["_fused_decode"] = FusedDecode.for_model(self.layers, LLAMA_LAYER, self.config)

    @torch.no_grad()
    def init_random_(self, seed: int) -> Llama:
        """N(0, 0.02) weights (transformers' initializer_range), unit norms, zero biases; reproducible."""
        gen = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.copy_(torch.empty(param.shape).normal_(0.0, 0.02, generator=gen))
        self.inv_freq = rope_inverse_frequencies(self.config)  # a buffer left empty by a meta-device build
        return self

    # -- the family's Hugging Face mapping (roseinfer.models.base.ModelFamily) ---------------
    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Build from a Llama / Qwen2 config.json (old `rope_theta` + `rope_scaling`, or `rope_parameters`)."""
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r} (silu is)")
        if hf.get("mlp_bias"):
            raise ValueError("MLP biases (mlp_bias) are not supported")
        if hf.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window) is not supported")
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        if rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = {}
        eos = hf.get("eos_token_id")
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos if eos is not None else 0]
        return ModelConfig(
            n_embd=hf["hidden_size"],
            n_layer=hf["num_hidden_layers"],
            n_head=hf["num_attention_heads"],
            n_kv_head=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"],
            n_positions=hf.get("max_position_embeddings", 2048),
            vocab_size=hf["vocab_size"],
            layer_norm_epsilon=hf.get("rms_norm_eps", 1e-6),
            eos_token_id=eos[0],
            stop_token_ids=tuple(eos[1:]),
            family=cls.model_type,
            rope_theta=float(theta),
            rope_scaling=rope or None,
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=cls._attention_bias(hf),
        )

    @staticmethod
    def _attention_bias(hf: dict[str, Any]) -> bool:
        if hf.get("attention_bias"):  # Llama's flag puts a bias on o_proj too, which no released checkpoint has
            raise ValueError("Llama attention biases (attention_bias) are not supported")
        return False

    @classmethod
    def config_to_hf(cls, config: ModelConfig) -> dict[str, Any]:
        """The config.json that transformers reads back as the same architecture."""
        eos = [config.eos_token_id, *config.stop_token_ids]
        hf = {
            "model_type": cls.model_type,
            "architectures": [cls.architecture],
            "hidden_act": "silu",
            "hidden_size": config.n_embd,
            "num_hidden_layers": config.n_layer,
            "num_attention_heads": config.n_head,
            "num_key_value_heads": config.n_kv_head,
            "head_dim": config.head_dim,
            "intermediate_size": config.intermediate_size,
            "max_position_embeddings": config.n_positions,
            "vocab_size": config.vocab_size,
            "rms_norm_eps": config.layer_norm_epsilon,
            "rope_theta": config.rope_theta,
            "rope_scaling": dict(config.rope_scaling) if config.rope_scaling else None,
            "tie_word_embeddings": config.tie_word_embeddings,
            "bos_token_id": config.eos_token_id,
            "eos_token_id": eos if len(eos) > 1 else eos[0],
        }
        return hf | cls._extra_hf(config)

    @staticmethod
    def _extra_hf(config: ModelConfig) -> dict[str, Any]:
        return {"attention_bias": False, "mlp_bias": False}

    @staticmethod
    def state_dict_from_hf(hf_state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
        """HF names -> roseinfer's: prefix dropped, q/k/v and gate/up concatenated, a tied head not duplicated."""
        hf_state = {name.removeprefix("model."): tensor for name, tensor in hf_state.items()}
        out: dict[str, torch.Tensor] = {}
        for i in range(config.n_layer):
            p = f"layers.{i}."
            try:
                for kind in ("weight", "bias") if config.attention_bias else ("weight",):
                    out[f"{p}self_attn.qkv_proj.{kind}"] = torch.cat(
                        [hf_state.pop(f"{p}self_attn.{n}_proj.{kind}") for n in "qkv"])
                out[f"{p}mlp.gate_up_proj.weight"] = torch.cat(
                    [hf_state.pop(f"{p}mlp.{n}_proj.weight") for n in ("gate", "up")])
            except KeyError as exc:
                raise ValueError(f"checkpoint lacks {exc.args[0]} (n_layer={config.n_layer})") from None
        lm_head = hf_state.pop("lm_head.weight", None)
        if config.tie_word_embeddings:
            if "embed_tokens.weight" not in hf_state and lm_head is not None:
                hf_state["embed_tokens.weight"] = lm_head
        elif lm_head is None:
            raise ValueError("checkpoint lacks lm_head.weight, and its config does not tie it to the embedding")
        else:
            out["lm_head.weight"] = lm_head
        extra = [n for n in hf_state if n.startswith("layers.") and int(n.split(".")[1]) >= config.n_layer]
        if extra:
            raise ValueError(f"checkpoint has layers past n_layer={config.n_layer}: {extra[:3]}")
        hf_state = {n: t for n, t in hf_state.items() if not n.endswith("rotary_emb.inv_freq")}
        return {**hf_state, **out}

    @staticmethod
    def state_dict_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """roseinfer's names -> transformers' (fp32, q/k/v and gate/up split again)."""
        hf: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            tensor = tensor.detach().cpu().float()
            if name == "lm_head.weight":
                hf[name] = tensor.contiguous()
                continue
            name = "model." + name
            if ".qkv_proj." in name:
                # rows: the query heads (as many as o_proj's inputs), then the k and v heads, equal in number
                q_rows = next(t for n, t in state.items() if n.endswith("self_attn.o_proj.weight")).shape[1]
                kv_rows = (tensor.shape[0] - q_rows) // 2
                for part, chunk in zip("qkv", tensor.split([q_rows, kv_rows, kv_rows])):
                    hf[name.replace("qkv_proj", f"{part}_proj")] = chunk.contiguous()
            elif ".gate_up_proj." in name:
                gate, up = tensor.chunk(2)
                hf[name.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
                hf[name.replace("gate_up_proj", "up_proj")] = up.contiguous()
            else:
                hf[name] = tensor.contiguous()
        return hf

    @staticmethod
    def num_parameters(config: ModelConfig) -> int:
        e, d, i = config.n_embd, config.head_dim, config.intermediate_size
        q, kv = config.n_head * d, config.n_kv_head * d
        per_layer = e * (q + 2 * kv) + q * e + 3 * e * i + 2 * e
        if config.attention_bias:
            per_layer += q + 2 * kv
        heads = 1 if config.tie_word_embeddings else 2
        return heads * config.vocab_size * e + config.n_layer * per_layer + e


class Qwen2(Llama):
    """Qwen2 / Qwen2.5: the Llama block with biases on q, k and v."""

    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"

    @staticmethod
    def _attention_bias(hf: dict[str, Any]) -> bool:
        return True

    @staticmethod
    def _extra_hf(config: ModelConfig) -> dict[str, Any]:
        return {"use_sliding_window": False}
