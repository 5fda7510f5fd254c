"""Seeded random GPT-2 weights in Hugging Face layout: one set of weights for roseinfer and every peer.

Made from a seed (no download, so any machine can reproduce a run), with the
GPT-2 tokenizer files beside them (the peers' converters read the vocabulary
from there). benchmarks/harness/peer_formats.py converts them into each peer's
own format; notebooks 11 and 12 load them directly.

Standard GPT-2 initialisation makes a random model repeat one token for ever,
which would make a greedy-agreement check pass whatever an engine does.
As in tests/conftest.py, the attention and MLP projections are scaled up
(`projection_scale`), so greedy decoding wanders through the vocabulary and
agreement means the engines computed the same thing. Throughput does not
depend on which tokens come out: every request runs to its length.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from roseinfer.models.loader import random_weights, save_hf_directory
from roseinfer.tokenizer import embedded_bpe_files


def make_hf_weights(root: Path, preset: str = "gpt2", seed: int = 0, projection_scale: float = 1.0) -> Path:
    """Seeded random weights of `preset` in HF layout, with GPT-2's tokenizer files; cached.

    Written by roseinfer's own save_hf_directory, whose config.json keeps
    `n_ctx`: llama.cpp's converter reads the context length from it, and
    transformers 5's save_pretrained no longer writes it.
    """
    directory = root / "hf"
    if (directory / "model.safetensors").is_file():
        return directory
    weights = random_weights(preset, seed)
    state = dict(weights.state_dict)
    with torch.no_grad():
        for name, tensor in state.items():
            if ".c_" in name and name.endswith("weight"):
                state[name] = tensor * projection_scale
    tmp = root / "hf.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    save_hf_directory(tmp, weights.config, state)
    vocab_file, merges_file = embedded_bpe_files()
    shutil.copyfile(vocab_file, tmp / "vocab.json")
    shutil.copyfile(merges_file, tmp / "merges.txt")
    (tmp / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer", "model_max_length": weights.config.n_positions})
    )
    tmp.rename(directory)  # atomic: a half-written directory is never taken as the cache
    return directory
