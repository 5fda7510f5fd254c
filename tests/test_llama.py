"""The Llama family (llama, qwen2) against transformers' LlamaForCausalLM / Qwen2ForCausalLM on the same weights.

Small random configs cover grouped-query attention at several ratios (and plain multi-head), head sizes 64 and
128, a query width unlike the hidden size, tied and untied LM heads, Qwen2's q/k/v biases and Llama 3's RoPE
scaling. Each is saved in Hugging Face layout and loaded by roseinfer from the directory, as a user's checkpoint
is; logits and greedy tokens are compared alone, batched, chunked, through the prefix cache and under
preemption, with every attention backend the CPU has.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import hf_greedy
from roseinfer import InferenceEngine, SamplingParams
from roseinfer.config import PRESETS, ModelConfig
from roseinfer.engine.batch import BatchEntry
from roseinfer.models.llama import Llama, rope_inverse_frequencies
from roseinfer.models.registry import model_family, num_parameters

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
CASES = {
    # name: (model_type, hidden, heads, kv_heads, head_dim, tied, extra config.json keys)
    "llama-gqa2-d64-tied": ("llama", 256, 4, 2, 64, True, {}),
    "llama-gqa4-d128-untied-llama3": ("llama", 256, 4, 1, 128, False, {"rope_scaling": LLAMA3_ROPE}),
    "llama-mha-d64": ("llama", 256, 4, 4, 64, False, {}),
    "qwen2-gqa3-d64-bias": ("qwen2", 384, 6, 2, 64, True, {"rope_theta": 1e6}),
}
PROMPTS = ["Hello world, this is a test", "The quick brown fox jumps over the lazy dog again and again.", "x",
           "Crème brûlée à la française, s'il vous plaît: 東京の天気は晴れです"]
WEIGHT_SCALE = 3.0  # random N(0, 0.02) weights make greedy repeat one token; scaled, it wanders


def build_hf(case: str, seed: int = 0, vocab_size: int = 50257):
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, hidden, heads, kv_heads, head_dim, tied, extra = CASES[case]
    config = AutoConfig.for_model(
        model_type, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=320, vocab_size=vocab_size,
        max_position_embeddings=512, tie_word_embeddings=tied, rms_norm_eps=1e-6, eos_token_id=50256,
        bos_token_id=50256, **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("_proj.weight"):
                param.mul_(WEIGHT_SCALE)
            elif "norm" in name:  # not all ones, so a wrong norm shows
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = build_hf(request.param)
    model.save_pretrained(path)
    return request.param, path, model


def _engine(path, **config) -> InferenceEngine:
    return InferenceEngine.from_pretrained(str(path), **{"num_kv_blocks": 128, **config})


def _entry(tokens, start, table):
    return BatchEntry(tokens, start, table, False, SamplingParams(), None)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_logits_match_transformers(case, backend):
    """Prefill, then decode steps on the cache, then a batch mixing a prefill, a chunk and a decode."""
    name, path, hf = case
    engine = _engine(path, attention_backend=backend)
    assert engine.model_config.n_kv_head == CASES[name][3]
    blocks = engine.block_manager
    a, b, c = (engine.tokenizer.encode(p) for p in (PROMPTS[3], PROMPTS[1], PROMPTS[2]))
    tables = [blocks.allocate(-(-len(x) // blocks.block_size)) for x in (a, b, c)]
    try:
        split = len(b) // 2 + 1  # an odd-length prefill, then one token a step
        steps = [engine.runner.logits_for([_entry(b[:split], 0, tables[1])])[-1]]
        for pos in range(split, len(b)):
            steps.append(engine.runner.logits_for([_entry([b[pos]], pos, tables[1])])[0])
        mixed = engine.runner.logits_for([_entry(a[:7], 0, tables[0]), _entry(c[-1:], len(c) - 1, tables[2])])
        mixed_rest = engine.runner.logits_for([_entry(a[7:], 7, tables[0])])
    finally:
        for t in tables:
            blocks.free(t)
    with torch.no_grad():
        ref_b = hf(torch.tensor([b])).logits[0, split - 1:]
        ref_a = hf(torch.tensor([a])).logits[0]
        ref_c = hf(torch.tensor([c])).logits[0, -1:]
    assert (torch.stack(steps) - ref_b).abs().max().item() <= 2e-4
    assert (mixed - torch.cat([ref_a[:7], ref_c])).abs().max().item() <= 2e-4
    assert (mixed_rest - ref_a[7:]).abs().max().item() <= 2e-4


def test_greedy_tokens_match_transformers_batched_chunked_cached_and_preempted(case):
    _, path, hf = case
    shared = "You are a helpful assistant for a bicycle shop. Answer briefly and politely, always. "
    prompts = PROMPTS + [shared + "Where is my order?", shared + "Do you sell helmets?"]
    new = 12
    engine = _engine(path)
    ids = [engine.tokenizer.encode(p) for p in prompts]
    expected = [hf_greedy(hf, x, new) for x in ids]
    assert len({tuple(e) for e in expected}) > 1 and any(len(set(e)) > 3 for e in expected)  # not degenerate
    params = SamplingParams(max_new_tokens=new, stop_on_eos=False)
    batched = engine.generate(prompts, params, max_num_batched_tokens=16)  # prompts cut into chunks
    assert [o.token_ids for o in batched] == expected
    again, stats = _run(engine, prompts[-2:], params)  # the shared prefix now comes from the cache
    assert again == expected[-2:] and stats["prefix_cache_hits"] > 0
    preempted, stats = _run(_engine(path, num_kv_blocks=12), prompts, params)  # too few blocks for all at once
    assert preempted == expected and stats["num_preemptions"] > 0


def _run(engine: InferenceEngine, prompts: list[str], params: SamplingParams):
    """Every prompt through one scheduler, step by step: (the tokens of each, the scheduler's kv_stats)."""
    scheduler = engine.new_scheduler(max_batch_size=len(prompts))
    rids = [engine.add_request(scheduler, prompt=p, params=params) for p in prompts]
    while scheduler.has_unfinished():
        engine.step(scheduler)
    return [scheduler.pop_response(r).token_ids for r in rids], scheduler.kv_stats()


def test_round_trip_through_hf_layout(case, tmp_path):
    """roseinfer's weights saved in HF layout load back as the same tensors, and config.json as the same
    architecture; the parameter count is transformers' own."""
    from roseinfer.models.loader import load_hf_directory, save_hf_directory

    _, path, hf = case
    loaded = load_hf_directory(path)
    assert num_parameters(loaded.config) == sum(p.numel() for p in hf.parameters())
    save_hf_directory(tmp_path, loaded.config, loaded.state_dict)
    again = load_hf_directory(tmp_path)
    assert again.config == loaded.config
    assert again.state_dict.keys() == loaded.state_dict.keys()
    assert all(torch.equal(again.state_dict[k], loaded.state_dict[k]) for k in loaded.state_dict)


def test_llama3_rope_frequencies_match_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, rope_theta=500000.0,
                     rope_scaling=dict(LLAMA3_ROPE, original_max_position_embeddings=8192, factor=32.0),
                     max_position_embeddings=131072)
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    ours = rope_inverse_frequencies(Llama.config_from_hf(hf.to_dict()))
    assert torch.allclose(ours, theirs.float(), rtol=1e-6, atol=0)


def test_sharded_checkpoint_loads(tmp_path):
    hf = build_hf("llama-gqa2-d64-tied")
    hf.save_pretrained(tmp_path, max_shard_size="2MB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    engine = _engine(tmp_path)
    ids = engine.tokenizer.encode(PROMPTS[0])
    out = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=6, stop_on_eos=False))[0]
    assert out.token_ids == hf_greedy(hf, ids, 6)


def test_config_json_eos_lists_and_unsupported_features():
    config = Llama.config_from_hf(dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                       intermediate_size=128, vocab_size=100, eos_token_id=[7, 8, 9]))
    assert (config.eos_token_id, config.stop_token_ids, config.n_kv_head, config.head_dim) == (7, (8, 9), 4, 16)
    for bad in ({"hidden_act": "gelu"}, {"mlp_bias": True}, {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}):
        with pytest.raises(ValueError):
            rope_inverse_frequencies(Llama.config_from_hf(dict(hidden_size=64, num_hidden_layers=1,
                                                               num_attention_heads=4, intermediate_size=128,
                                                               vocab_size=100, **bad)))
    with pytest.raises(ValueError, match="sliding"):
        model_family("qwen2").config_from_hf(dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                                  intermediate_size=128, vocab_size=100, use_sliding_window=True))


@pytest.mark.parametrize("preset", ["smollm2-135m", "smollm2-360m", "qwen2.5-0.5b", "llama-3.2-1b"])
def test_presets_are_the_published_architectures(preset):
    """Each preset's parameter count, as the model cards give it (rounded), and its KV bytes per token."""
    config: ModelConfig = PRESETS[preset]
    published = {"smollm2-135m": 134.5e6, "smollm2-360m": 361.8e6, "qwen2.5-0.5b": 494.0e6,
                 "llama-3.2-1b": 1235.8e6}[preset]
    assert abs(num_parameters(config) - published) / published < 0.01
    assert config.n_head % config.n_kv_head == 0 and config.n_kv_head < config.n_head


def test_random_tiny_preset_serves_offline():
    engine = InferenceEngine.from_pretrained("llama-tiny", offline=True, num_kv_blocks=64)
    assert engine.weights.is_random and engine.model_config.family == "llama"
    out = engine.generate(["Hello"], SamplingParams(max_new_tokens=5, stop_on_eos=False))[0]
    assert len(out.token_ids) == 5
    info = engine.describe()
    assert (info["family"], info["n_head"], info["n_kv_head"]) == ("llama", 4, 2)
    # K and V, 2 layers, 2 KV heads of 16 fp32 numbers: half what 4 heads of multi-head attention would keep
    assert info["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4
    assert info["kv_cache_tokens"] == 64 * 16


@pytest.fixture(scope="module")
def qwen2_with_tokens(tmp_path_factory):
    """A GQA checkpoint and transformers' greedy tokens for two prompts, made outside any virtual-CUDA mode
    (a module fixture is set up before the function-scoped engine_device enters it)."""
    from roseinfer.tokenizer import GPT2Tokenizer

    path = tmp_path_factory.mktemp("qwen2-triton")
    hf = build_hf("qwen2-gqa3-d64-bias")
    hf.save_pretrained(path)
    tokenizer = GPT2Tokenizer.from_pretrained(None)
    return path, {p: hf_greedy(hf, tokenizer.encode(p), 6) for p in PROMPTS[:2]}


def test_triton_backend_gives_transformers_tokens_for_gqa(qwen2_with_tokens, engine_device):
    """The Triton kernels (interpreted on CPU; CUDA's code path under virtual CUDA) on a GQA model."""
    from roseinfer.kernels.triton import triton_available

    if not triton_available():
        pytest.skip("triton is not installed")
    path, expected = qwen2_with_tokens
    engine = _engine(path, attention_backend="triton", device=engine_device, dtype="float32")
    params = SamplingParams(max_new_tokens=6, stop_on_eos=False)
    outputs = engine.generate(list(expected), params, max_num_batched_tokens=8)
    assert [o.token_ids for o in outputs] == list(expected.values())


CHAT_TEMPLATE = (  # ChatML, as SmolLM2-Instruct and Qwen2.5-Instruct write it
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_a_checkpoints_tokenizer_chat_template_and_end_of_turn_ids_are_used(tmp_path):
    """An instruct checkpoint's directory: tokenizer.json, tokenizer_config.json's chat template and
    generation_config.json's end-of-turn id, each used as transformers uses them."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import AutoTokenizer, GenerationConfig

    from roseinfer.server.__main__ import chat_formatter
    from roseinfer.tokenizer import embedded_bpe_files

    hf = build_hf("llama-gqa2-d64-tied", vocab_size=50272)  # GPT-2's BPE and ChatML's two special tokens
    hf.save_pretrained(tmp_path)
    bpe = ByteLevelBPETokenizer(*embedded_bpe_files())
    bpe.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    bpe.save(str(tmp_path / "tokenizer.json"))
    im_end = bpe.token_to_id("<|im_end|>")
    assert im_end < hf.config.vocab_size
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}))
    GenerationConfig(eos_token_id=[50256, im_end]).save_pretrained(tmp_path)

    engine = _engine(tmp_path)
    assert engine.tokenizer.source == str(tmp_path)
    assert engine.eos_token_ids == {50256, im_end}
    messages = [{"role": "user", "content": "Where is my order?"}]
    ours = chat_formatter(None, engine.weights.folder).render(messages)
    theirs = AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(messages, tokenize=False,
                                                                          add_generation_prompt=True)
    assert ours == theirs
    ids = engine.tokenizer.encode(ours)
    assert ids == AutoTokenizer.from_pretrained(tmp_path).encode(theirs)
    out = engine.generate([ours], SamplingParams(max_new_tokens=8, stop_on_eos=False))[0]
    assert out.token_ids == hf_greedy(hf, ids, 8)
    # <|im_end|> ends a request as EOS does (stop_on_eos)
    scheduler = engine.new_scheduler()
    assert scheduler.eos_token_ids == {50256, im_end}
    # the server started on the directory renders chat with the checkpoint's template
    from roseinfer.server.__main__ import build_app, build_parser

    app = build_app(build_parser().parse_args(["--model", str(tmp_path), "--num-kv-blocks", "16"]))
    try:
        assert app.state.settings.chat.render(messages) == theirs
        assert app.state.manager.engine.describe()["n_kv_head"] == 2
    finally:
        app.state.manager.close()


@pytest.mark.parametrize("variant", [{"dtype": "bfloat16"}, {"quantization": "int8"}])
def test_the_cpu_fast_paths_run_the_family(case, variant):
    """bf16 and int8 projections (packed fused q/k/v and gate/up, the LM head too) agree with transformers' fp32
    logits to their precision, and batched equals alone."""
    from roseinfer.models.packed_linear import PackedLinear

    _, path, hf = case
    engine = _engine(path, **variant)
    layer = engine.runner.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, PackedLinear) and isinstance(layer.mlp.gate_up_proj, PackedLinear)
    ids = engine.tokenizer.encode(PROMPTS[1])
    table = engine.block_manager.allocate(-(-len(ids) // engine.block_manager.block_size))
    try:
        ours = engine.runner.logits_for([_entry(ids, 0, table)]).float()
    finally:
        engine.block_manager.free(table)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (ours - theirs).abs().max() <= 0.1 * theirs.abs().max()  # bf16 or int8 rounding, not a wrong model
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.6
    params = SamplingParams(max_new_tokens=6, stop_on_eos=False)
    together = [o.token_ids for o in engine.generate(PROMPTS, params)]
    assert together == [engine.generate([p], params)[0].token_ids for p in PROMPTS]
