"""Weights from every source the loader accepts, and clear errors for the rest."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from conftest import build_hf_tiny, hf_greedy
from roseinfer import InferenceEngine, SamplingParams
from roseinfer.models.loader import load_weights

PROMPT = "A checkpoint the tests have never seen"


def _greedy(engine, n=12):
    ids = engine.tokenizer.encode(PROMPT)
    return ids, engine.generate([ids], SamplingParams(max_new_tokens=n, stop_on_eos=False))[0].token_ids


def _write_openai_style_bin(model, directory):
    """The layout of the original GPT-2 release: no 'transformer.' prefix, mask buffers, .bin."""
    directory.mkdir()
    state = {
        k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"
    }
    n_pos = model.config.n_positions
    for i in range(model.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n_pos, n_pos)).view(1, 1, n_pos, n_pos)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, directory / "pytorch_model.bin")
    (directory / "config.json").write_text(json.dumps(model.config.to_dict()))


@pytest.mark.parametrize("layout", ["safetensors", "sharded-safetensors", "openai-bin"])
def test_unseen_hf_directory_gives_hf_greedy_tokens(tmp_path, layout):
    hf = build_hf_tiny(seed=1234, n_layer=3, n_embd=96, n_head=6)
    directory = tmp_path / layout
    if layout == "safetensors":
        hf.save_pretrained(directory)
    elif layout == "sharded-safetensors":
        hf.save_pretrained(directory, max_shard_size="2MB")
        assert (directory / "model.safetensors.index.json").exists()
    else:
        _write_openai_style_bin(hf, directory)
    engine = InferenceEngine.from_pretrained(str(directory), num_kv_blocks=64)
    assert engine.weights.source == "hf-directory"
    assert engine.model_config.n_layer == 3
    ids, ours = _greedy(engine)
    assert ours == hf_greedy(hf, ids, 12)


def test_local_hf_cache_is_found_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    hf = build_hf_tiny(seed=99)
    snapshot = tmp_path / "hub" / "models--someorg--tiny-gpt2" / "snapshots" / ("a" * 40)
    hf.save_pretrained(snapshot)
    (tmp_path / "hub" / "models--someorg--tiny-gpt2" / "refs").mkdir()
    (tmp_path / "hub" / "models--someorg--tiny-gpt2" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    engine = InferenceEngine.from_pretrained("someorg/tiny-gpt2", num_kv_blocks=64)
    assert engine.weights.source == "hf-cache"
    ids, ours = _greedy(engine)
    assert ours == hf_greedy(hf, ids, 12)
    # A preset name can be pointed at a cached id explicitly.
    by_flag = InferenceEngine.from_pretrained("gpt2", hf_model_id="someorg/tiny-gpt2", num_kv_blocks=64)
    assert by_flag.weights.source == "hf-cache"
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        load_weights("gpt2", hf_model_id="someorg/absent")


def test_random_init_is_seeded():
    a = load_weights("gpt2-tiny", seed=1).state_dict
    b = load_weights("gpt2-tiny", seed=1).state_dict
    c = load_weights("gpt2-tiny", seed=2).state_dict
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["wte.weight"], c["wte.weight"])
    assert torch.equal(a["h.0.ln_1.weight"], torch.ones(64))


def test_presets_have_gpt2_shapes():
    from roseinfer.config import PRESETS
    from roseinfer.models.registry import num_parameters

    sizes = {name: round(num_parameters(cfg) / 1e6) for name, cfg in PRESETS.items()}
    assert sizes["gpt2"] == 124 and sizes["gpt2-medium"] == 355
    assert sizes["gpt2-large"] == 774 and sizes["gpt2-xl"] == 1558
    assert sizes["gpt2-tiny"] < 5


def test_unknown_names_and_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        load_weights("no-such-model")
    bogus = tmp_path / "bogus.pt"
    torch.save({"hello": 1}, bogus)
    with pytest.raises(ValueError, match="not a roseinfer checkpoint"):
        load_weights(str(bogus))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_weights(str(empty_dir))
    with pytest.raises(TypeError, match="unknown engine option"):
        InferenceEngine.from_pretrained("gpt2-tiny", num_kv_blockz=3)


def test_a_new_family_is_one_class_and_one_registry_line(tmp_path, hf_tiny_dir, monkeypatch):
    """A family registered under its model_type loads from an HF directory and runs in the engine."""
    from roseinfer.models import registry
    from roseinfer.models.gpt2 import GPT2

    class Renamed(GPT2):  # the same architecture under another model_type: the seam, not the maths
        model_type = "gpt2-renamed"

        @staticmethod
        def config_from_hf(hf):
            return dataclasses.replace(GPT2.config_from_hf(hf), family="gpt2-renamed")

    monkeypatch.setitem(registry.MODEL_FAMILIES, Renamed.model_type, Renamed)
    renamed = tmp_path / "renamed"
    shutil.copytree(hf_tiny_dir, renamed)
    config = json.loads((renamed / "config.json").read_text())
    (renamed / "config.json").write_text(json.dumps({**config, "model_type": "gpt2-renamed"}))
    params = SamplingParams(max_new_tokens=6, stop_on_eos=False)
    base = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=32)
    other = InferenceEngine.from_pretrained(str(renamed), num_kv_blocks=32)
    assert isinstance(other.runner.model, Renamed) and other.describe()["family"] == "gpt2-renamed"
    assert other.generate(["seam"], params)[0].token_ids == base.generate(["seam"], params)[0].token_ids


def test_unknown_families_are_refused_by_name(tmp_path, hf_tiny_dir):
    bad = tmp_path / "bad"
    shutil.copytree(hf_tiny_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    with pytest.raises(ValueError, match="'mamba' is not supported; roseinfer runs gpt2"):
        load_weights(str(bad))


def test_the_kv_cache_is_shaped_by_kv_heads_and_head_dim():
    from roseinfer.config import ModelConfig
    from roseinfer.engine.runner import kv_cache_bytes_per_block

    gqa = ModelConfig(n_embd=64, n_layer=2, n_head=8, n_kv_head=2, head_dim=16)
    mha = ModelConfig(n_embd=64, n_layer=2, n_head=8)
    assert (mha.n_kv_head, mha.head_dim) == (8, 8)
    # 2 (K and V) x layers x block x KV heads x head size x 4 bytes
    assert kv_cache_bytes_per_block(gqa, 16, torch.float32) == 2 * 2 * 16 * 2 * 16 * 4
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        ModelConfig(n_embd=64, n_head=8, n_kv_head=3)
