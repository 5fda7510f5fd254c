"""Seeded random weights in Hugging Face layout: one set of weights for roseinfer and every peer.

Made from a seed (no download, so any machine can reproduce a run), with
tokenizer files beside them (the peers' converters read the vocabulary from
there). benchmarks/harness/peer_formats.py converts them into each peer's own
format; notebooks 13 and 11 load them directly.

- GPT-2 presets get GPT-2's own vocab.json and merges.txt.
- Llama-family presets (SmolLM2's shape, 49,152 ids) get a tokenizer.json in
  the form such checkpoints ship: GPT-2's byte-level BPE cut to the model's
  vocabulary, its first `vocab_size - 1` tokens and their merges, with
  `<|endoftext|>` (BOS and EOS) as the last id. Benchmarks feed token ids, so
  what matters is that every converter accepts it and that every id means the
  same token to every engine.

Standard initialisation makes a random model repeat one token for ever,
which would make a greedy-agreement check pass whatever an engine does.
As in tests/conftest.py, the attention and MLP projections are scaled up
(`projection_scale`), so greedy decoding wanders through the vocabulary and
agreement means the engines computed the same thing. Throughput does not
depend on which tokens come out: every request runs to its length.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch

from roseinfer.config import PRESETS
from roseinfer.models.loader import save_hf_directory
from roseinfer.models.registry import model_family
from roseinfer.tokenizer import embedded_bpe_files

END_OF_TEXT = "<|endoftext|>"


def make_hf_weights(root: Path, preset: str = "gpt2", seed: int = 0, projection_scale: float = 1.0) -> Path:
    """Seeded random weights of `preset` in HF layout, with tokenizer files; cached under root/hf.

    Written by roseinfer's own save_hf_directory, whose GPT-2 config.json keeps
    `n_ctx`: llama.cpp's converter reads the context length from it, and
    transformers 5's save_pretrained no longer writes it.
    """
    directory = root / "hf"
    if (directory / "model.safetensors").is_file():
        return directory
    config = PRESETS[preset]
    if config.family != "gpt2":  # the end-of-text token is the last id (see the module's docstring)
        config = dataclasses.replace(config, eos_token_id=config.vocab_size - 1, stop_token_ids=())
    with torch.device("meta"):
        model = model_family(config.family)(config)
    state = model.to_empty(device="cpu").init_random_(seed).state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            if _is_projection(name):
                state[name] = tensor * projection_scale
    tmp = root / "hf.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    save_hf_directory(tmp, config, state)
    if config.family == "gpt2":
        vocab_file, merges_file = embedded_bpe_files()
        shutil.copyfile(vocab_file, tmp / "vocab.json")
        shutil.copyfile(merges_file, tmp / "merges.txt")
        tokenizer_config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": config.n_positions}
    else:
        write_cut_bpe_tokenizer(tmp / "tokenizer.json", config.vocab_size)
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": END_OF_TEXT,
            "eos_token": END_OF_TEXT,
            "model_max_length": config.n_positions,
        }
    (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    tmp.rename(directory)  # atomic: a half-written directory is never taken as the cache
    return directory


def _is_projection(name: str) -> bool:
    """An attention or MLP weight matrix (GPT-2's c_attn/c_proj/c_fc, Llama's *_proj), not an embedding."""
    return name.endswith("weight") and (".c_" in name or "_proj" in name)


def write_cut_bpe_tokenizer(path: Path, vocab_size: int) -> Path:
    """GPT-2's byte-level BPE cut to `vocab_size` ids: its first vocab_size - 1 tokens, the merges that make
    them, and END_OF_TEXT (a special token) as id vocab_size - 1."""
    from tokenizers import ByteLevelBPETokenizer

    vocab_file, merges_file = embedded_bpe_files()
    full = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
    vocab = {token: i for token, i in full.items() if i < vocab_size - 1}
    merges = []
    for line in Path(merges_file).read_text(encoding="utf-8").splitlines():
        parts = line.split(" ")
        if len(parts) == 2 and not line.startswith("#version"):
            left, right = parts
            if left in vocab and right in vocab and left + right in vocab:
                merges.append((left, right))
    tokenizer = ByteLevelBPETokenizer(vocab, merges)
    tokenizer.add_special_tokens([END_OF_TEXT])
    if tokenizer.token_to_id(END_OF_TEXT) != vocab_size - 1 or tokenizer.get_vocab_size() != vocab_size:
        raise AssertionError(f"the cut tokenizer has {tokenizer.get_vocab_size()} ids, not {vocab_size}")
    tokenizer.save(str(path))
    return path
