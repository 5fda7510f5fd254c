"""The model families roseinfer runs, by name (`ModelConfig.family`, config.json's model_type)."""

from __future__ import annotations

from roseinfer.config import ModelConfig
from roseinfer.models.base import ModelFamily
from roseinfer.models.gpt2 import GPT2
from roseinfer.models.llama import Llama, Qwen2

MODEL_FAMILIES: dict[str, ModelFamily] = {family.model_type: family for family in (GPT2, Llama, Qwen2)}


def model_family(name: str) -> ModelFamily:
    """The family class for a ModelConfig.family or an HF model_type; ValueError names the known ones."""
    try:
        return MODEL_FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"model family {name!r} is not supported; roseinfer runs {', '.join(sorted(MODEL_FAMILIES))}"
        ) from None


def num_parameters(config: ModelConfig) -> int:
    """Weights of an architecture, counted by its family (a tied LM head counted once)."""
    return model_family(config.family).num_parameters(config)
