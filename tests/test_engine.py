"""The public InferenceEngine API: generate, stream_generate, stops, seeds, checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import hf_greedy
from roseinfer import InferenceEngine, InvalidRequestError, SamplingParams
from roseinfer.models.registry import num_parameters

PROMPTS = [
    "Hello world, this is a test",
    "Once upon a time in a land far away, there lived",
    "Crème brûlée",
    "東京の天気は",
    "🙂",
    "The",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]

GREEDY = SamplingParams(max_new_tokens=20, stop_on_eos=False)


def test_batched_equals_solo_greedy(engine):
    solo = [engine.generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    batched = [o.token_ids for o in engine.generate(PROMPTS, GREEDY)]
    assert batched == solo
    assert engine.block_manager.num_used_blocks == 0


def test_prompt_logits_match_hf_and_free_their_blocks(engine, hf_model):
    import torch

    ids = engine.tokenizer.encode(PROMPTS[1])
    ours = engine.prompt_logits(ids)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([ids])).logits[0]
    assert ours.shape == theirs.shape and ours.dtype == torch.float32
    assert (ours - theirs).abs().max().item() <= 1e-4
    # The last position's argmax is the first greedy token.
    assert int(ours[-1].argmax()) == engine.generate([ids], SamplingParams(max_new_tokens=1))[0].token_ids[0]
    assert engine.block_manager.num_used_blocks == 0


def test_outputs_keep_prompt_order_and_fields(engine):
    outs = engine.generate(PROMPTS[:3], SamplingParams(max_new_tokens=5, stop_on_eos=False))
    assert [o.prompt for o in outs] == PROMPTS[:3]
    for o in outs:
        assert o.finish_reason == "length"
        assert len(o.token_ids) == 5
        assert o.text == engine.tokenizer.decode(o.token_ids)
        assert o.prompt_token_ids == engine.tokenizer.encode(o.prompt)


def test_token_id_prompts_and_a_single_string(engine):
    ids = engine.tokenizer.encode(PROMPTS[0])
    by_ids = engine.generate([ids], GREEDY)[0]
    by_text = engine.generate(PROMPTS[0], GREEDY)[0]
    assert by_ids.token_ids == by_text.token_ids
    assert by_ids.prompt is None


def test_stream_generate_pieces_equal_generate_text(engine):
    for prompt in PROMPTS:
        pieces = list(engine.stream_generate(prompt, GREEDY))
        assert "".join(pieces) == engine.generate([prompt], GREEDY)[0].text
        assert all(pieces)  # no empty pieces are yielded
    assert engine.block_manager.num_used_blocks == 0


def test_stream_generate_frees_blocks_when_abandoned(engine):
    stream = engine.stream_generate(PROMPTS[1], GREEDY)
    next(stream)
    assert engine.block_manager.num_used_blocks > 0
    stream.close()
    assert engine.block_manager.num_used_blocks == 0


def test_seeded_sampling_reproducible_and_batch_independent(engine):
    params = SamplingParams(
        max_new_tokens=16, temperature=1.0, top_k=50, top_p=0.95, seed=123, stop_on_eos=False
    )
    a = engine.generate([PROMPTS[0]], params)[0].token_ids
    b = engine.generate([PROMPTS[0]], params)[0].token_ids
    batch = engine.generate(PROMPTS[:4], params)
    assert a == b == batch[0].token_ids
    other = SamplingParams(max_new_tokens=16, temperature=1.0, seed=124, stop_on_eos=False)
    assert engine.generate([PROMPTS[0]], other)[0].token_ids != a


def test_stop_string_ends_generation(engine):
    full = engine.generate([PROMPTS[1]], SamplingParams(max_new_tokens=30, stop_on_eos=False))[0]
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert stop.strip()
    params = SamplingParams(max_new_tokens=30, stop_on_eos=False, stop=[stop])
    out = engine.generate([PROMPTS[1]], params)[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.find(stop)]
    assert out.token_ids == full.token_ids[: len(out.token_ids)]
    assert len(out.token_ids) < len(full.token_ids)
    assert "".join(engine.stream_generate(PROMPTS[1], params)) == out.text


def test_eos_ends_generation_with_stop(hf_tiny_dir, tmp_path):
    """Declare the 6th greedy token to be EOS: generation stops there, EOS not in the text."""
    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=64)
    free_run = engine.generate([PROMPTS[0]], GREEDY)[0].token_ids
    eos = free_run[5]
    first = free_run.index(eos)
    model_dir = tmp_path / "eos-model"
    shutil.copytree(hf_tiny_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["eos_token_id"] = eos
    (model_dir / "config.json").write_text(json.dumps(config))
    eos_engine = InferenceEngine.from_pretrained(str(model_dir), num_kv_blocks=64)
    out = eos_engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=20))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == free_run[: first + 1]
    assert out.text == eos_engine.tokenizer.decode(free_run[:first])
    assert "".join(eos_engine.stream_generate(PROMPTS[0], SamplingParams(max_new_tokens=20))) == out.text
    ignoring = eos_engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=20, stop_on_eos=False))[0]
    assert ignoring.finish_reason == "length" and ignoring.token_ids == free_run


def test_checkpoint_save_load_round_trip(engine, tmp_path, hf_model):
    path = tmp_path / "tiny.pt"
    engine.save_checkpoint(path)
    reloaded = InferenceEngine.from_pretrained("gpt2", checkpoint_path=str(path), num_kv_blocks=64)
    assert reloaded.weights.source == "checkpoint"
    assert reloaded.model_config == engine.model_config
    again = InferenceEngine.from_pretrained(str(path), num_kv_blocks=64)  # a file path works too
    ids = engine.tokenizer.encode(PROMPTS[1])
    expected = hf_greedy(hf_model, ids, 12)
    params = SamplingParams(max_new_tokens=12, stop_on_eos=False)
    assert reloaded.generate([ids], params)[0].token_ids == expected
    assert again.generate([ids], params)[0].token_ids == expected


def test_prompt_too_long_for_the_context_is_refused(engine):
    with pytest.raises(InvalidRequestError, match=r"250 tokens .* 10 new .* 256") as err:
        engine.generate([[1] * 250], SamplingParams(max_new_tokens=10))
    assert err.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.generate([""], GREEDY)
    with pytest.raises(InvalidRequestError, match="token ids"):
        engine.generate([[50257]], GREEDY)
    assert engine.block_manager.num_used_blocks == 0


def test_embedded_default_gpt2_works_offline_and_says_its_weights_are_random(caplog):
    engine = InferenceEngine.from_pretrained(num_kv_blocks=64)
    assert engine.weights.is_random
    assert engine.model_config.n_layer == 12 and engine.model_config.n_embd == 768
    assert 124e6 < num_parameters(engine.model_config) < 125e6
    assert any("RANDOM weights" in r.getMessage() and "gpt2" in r.getMessage() for r in caplog.records)
    out = engine.generate(["Hello"], SamplingParams(max_new_tokens=3, stop_on_eos=False))[0]
    assert len(out.token_ids) == 3


def test_kv_pool_from_a_block_count_or_a_memory_budget(hf_tiny_dir):
    by_count = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=40)
    assert by_count.num_kv_blocks == 40 and by_count.runner.kv_cache.shape[2] == 40
    # tiny: 2 layers x (K, V) x 16 tokens x 64 values x 4 bytes = 16 KiB a block; 1 MiB holds 64
    by_budget = InferenceEngine.from_pretrained(str(hf_tiny_dir), kv_cache_memory_gb=1 / 1024)
    assert by_budget.num_kv_blocks == 64
    # never less than one full-context request (256 tokens = 16 blocks)
    assert InferenceEngine.from_pretrained(str(hf_tiny_dir), kv_cache_memory_gb=1e-6).num_kv_blocks == 16
