"""Weights and tokenizers from the Hub, through huggingface_hub against a Hub-compatible local endpoint.

Nothing here reaches the internet and nothing in huggingface_hub is mocked:
the endpoint is a real HTTP server on 127.0.0.1 (tests/hub_server.py) that
HF_ENDPOINT points at, and the files land in a temporary HF cache.
"""

from __future__ import annotations

import shutil
import socket
import time

import pytest

from conftest import build_hf_tiny, hf_greedy
from hub_server import HubServer
from roseinfer import InferenceEngine, SamplingParams
from roseinfer.config import PRESET_HF_IDS
from roseinfer.hub import HUB_TIMEOUT_S
from roseinfer.models.loader import load_weights
from roseinfer.tokenizer import GPT2Tokenizer, embedded_bpe_files

PROMPT = "Weights that came over HTTP"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    model = build_hf_tiny(seed=5)
    model.save_pretrained(tmp_path / "tiny")
    # A .bin beside the safetensors: the engine must not fetch it.
    shutil.copy(tmp_path / "tiny" / "model.safetensors", tmp_path / "tiny" / "pytorch_model.bin")
    tokenizer_dir = tmp_path / "tok"
    tokenizer_dir.mkdir()
    vocab, merges = embedded_bpe_files()
    shutil.copy(vocab, tokenizer_dir / "vocab.json")
    shutil.copy(merges, tokenizer_dir / "merges.txt")
    with HubServer() as server:
        server.add_directory("someorg/tiny-gpt2", tmp_path / "tiny")
        server.add_directory("openai-community/gpt2", tmp_path / "tiny")
        server.add_directory("someorg/bpe", tokenizer_dir)
        server.model = model
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield server


def _greedy(engine, n=10):
    ids = engine.tokenizer.encode(PROMPT)
    out = engine.generate([ids], SamplingParams(max_new_tokens=n, stop_on_eos=False))[0]
    return ids, out.token_ids


def test_download_from_hub_endpoint_gives_hf_greedy_tokens(hub, tmp_path):
    engine = InferenceEngine.from_pretrained("someorg/tiny-gpt2", num_kv_blocks=32)
    assert engine.weights.source == "hf-hub"
    assert "downloaded from" in engine.weights.description
    # the weights, and of the companions (tokenizer, chat template, end-of-turn ids) the one this repository has
    assert hub.files_fetched("someorg/tiny-gpt2") == {"config.json", "model.safetensors", "generation_config.json"}
    assert (tmp_path / "cache" / "models--someorg--tiny-gpt2").is_dir()
    ids, ours = _greedy(engine)
    assert ours == hf_greedy(hub.model, ids, 10)

    # Second time: the local cache answers and nothing goes over the network.
    before = len(hub.requests)
    again = InferenceEngine.from_pretrained("someorg/tiny-gpt2", num_kv_blocks=32)
    assert again.weights.source == "hf-cache" and len(hub.requests) == before

    # A preset name resolves to its Hub id, and --tokenizer-name takes a Hub id.
    preset = InferenceEngine.from_pretrained("gpt2", tokenizer_name="someorg/bpe", num_kv_blocks=32)
    assert preset.weights.source == "hf-hub" and preset.model_config.n_layer == 2
    assert hub.files_fetched("someorg/bpe") == {"vocab.json", "merges.txt"}
    assert preset.tokenizer.source.startswith("someorg/bpe")
    assert preset.tokenizer.encode(PROMPT) == ids


def test_offline_env_and_flag_never_reach_the_hub(hub, monkeypatch):
    # gpt2-tiny, pointed at the endpoint's repository: online it would be downloaded.
    monkeypatch.setitem(PRESET_HF_IDS, "gpt2-tiny", ("someorg/tiny-gpt2",))
    weights = load_weights("gpt2-tiny", offline=True)
    assert weights.is_random and "offline" in weights.description
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    weights = load_weights("gpt2-tiny")
    assert weights.is_random and "offline" in weights.description
    with pytest.raises(FileNotFoundError, match="offline"):
        load_weights("someorg/bpe")  # not a preset: nothing to fall back to
    with pytest.raises(FileNotFoundError, match="offline"):
        GPT2Tokenizer.from_pretrained("someorg/bpe")
    assert hub.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert load_weights("gpt2-tiny").source == "hf-hub"


def test_server_offline_flag_reaches_the_engine(hub, monkeypatch):
    from roseinfer.server.__main__ import build_app, build_parser

    monkeypatch.setitem(PRESET_HF_IDS, "gpt2-tiny", ("someorg/tiny-gpt2",))
    args = ["--model", "gpt2-tiny", "--num-kv-blocks", "16"]
    app = build_app(build_parser().parse_args([*args, "--offline"]))
    app.state.manager.close()
    engine = app.state.manager.engine
    assert engine.config.offline and engine.weights.is_random and hub.requests == []
    app = build_app(build_parser().parse_args(args))
    app.state.manager.close()
    assert app.state.manager.engine.weights.source == "hf-hub"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_hub_falls_back_to_random_weights_in_seconds(tmp_path, monkeypatch):
    monkeypatch.setitem(PRESET_HF_IDS, "gpt2-tiny", ("someorg/tiny-gpt2",))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")  # connection refused
    start = time.perf_counter()
    weights = load_weights("gpt2-tiny")
    assert time.perf_counter() - start < 3.0
    assert weights.is_random and "not reachable" in weights.description

    # An endpoint that accepts the connection and never answers: the timeout bounds the wait.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        start = time.perf_counter()
        weights = load_weights("gpt2-tiny")
        assert time.perf_counter() - start < HUB_TIMEOUT_S + 2.0
    assert weights.is_random and "Timeout" in weights.description


def test_sharded_checkpoint_downloads_the_index_and_its_shards(hub, tmp_path):
    sharded = tmp_path / "sharded"
    hub.model.save_pretrained(sharded, max_shard_size="5MB")
    hub.add_directory("someorg/sharded", sharded)
    engine = InferenceEngine.from_pretrained("someorg/sharded", num_kv_blocks=32)
    fetched = hub.files_fetched("someorg/sharded")
    assert "model.safetensors.index.json" in fetched and len(fetched) > 3
    ids, ours = _greedy(engine)
    assert ours == hf_greedy(hub.model, ids, 10)
