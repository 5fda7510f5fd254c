"""The CPU's compiled decode step (torch.compile): the same tokens as the eager step."""

import pytest
import torch

from roseinfer import InferenceEngine, SamplingParams

PROMPTS = [f"compiled row {i} " * (i + 1) for i in range(5)]


def run(engine, prompts, params, max_batch_size=4):
    """Through the scheduler, so the batch shrinks and grows (batch 1 included) and prefills interleave."""
    scheduler = engine.new_scheduler(max_batch_size=max_batch_size)
    rids = [engine.add_request(scheduler, prompt=p, params=params) for p in prompts]
    while scheduler.has_unfinished():
        engine.step(scheduler)
    return [scheduler.pop_response(r).token_ids for r in rids]


GREEDY = SamplingParams(max_new_tokens=10, stop_on_eos=False)


def test_compiled_decode_gives_the_eager_tokens():
    """fp32: the fused loops compute what the eager operators do, so tokens are identical."""
    seeded = SamplingParams(max_new_tokens=6, temperature=0.9, top_k=40, seed=7, stop_on_eos=False)
    eager = InferenceEngine.from_pretrained("gpt2-tiny", num_kv_blocks=64, dtype="float32")
    compiled = InferenceEngine.from_pretrained("gpt2-tiny", num_kv_blocks=64, dtype="float32", compile_decode=True)
    assert compiled.describe()["compile_decode"]
    for params in (GREEDY, seeded):
        assert run(compiled, PROMPTS, params) == run(eager, PROMPTS, params)
    assert run(compiled, PROMPTS[:1], GREEDY) == run(eager, PROMPTS[:1], GREEDY)  # batch 1 throughout
    assert compiled.runner.compiled.compile_seconds > 0


def test_compiled_bf16_decode_agrees_with_eager_bf16():
    """bf16: a fused loop rounds to bf16 once where eager rounds after every operator, so logits
    differ in the last bits and a near-tie may flip: agreement, not identity."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("no bf16 on this CPU")
    eager = run(InferenceEngine.from_pretrained("gpt2-tiny", num_kv_blocks=64, dtype="bfloat16"), PROMPTS, GREEDY)
    compiled = InferenceEngine.from_pretrained("gpt2-tiny", num_kv_blocks=64, dtype="bfloat16", compile_decode=True)
    got = run(compiled, PROMPTS, GREEDY)
    # Sequences agree up to their first flip; count the tokens before it.
    agreed = sum(next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(got, eager))
    assert agreed / sum(map(len, eager)) >= 0.8


def test_compiled_decode_needs_the_fused_cpu_backend():
    with pytest.raises(ValueError, match="compile_decode needs the 'cpu' attention backend"):
        InferenceEngine.from_pretrained("gpt2-tiny", num_kv_blocks=16, attention_backend="torch", compile_decode=True)
