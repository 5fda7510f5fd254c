"""roseinfer's GPT-2 against HF GPT2LMHeadModel on the same weights."""

from __future__ import annotations

import pytest
import torch

from conftest import hf_greedy
from roseinfer import SamplingParams
from roseinfer.engine.batch import BatchEntry

PROMPTS = [
    "Hello world, this is a test",
    "The quick brown fox jumps over the lazy dog.",
    "Crème brûlée à la française, s'il vous plaît",
    "東京の天気は晴れです。北京欢迎你",
    "Emoji time: 🙂🚀🎉 and 👩‍👩‍👧 family",
    "x",
]


def _entry(tokens, start, table, sample=False):
    return BatchEntry(tokens, start, table, sample, SamplingParams(), None)


def test_prefill_logits_match_hf(engine, hf_model):
    blocks = engine.block_manager
    for prompt in PROMPTS:
        ids = engine.tokenizer.encode(prompt)
        table = blocks.allocate(-(-len(ids) // blocks.block_size))
        try:
            ours = engine.runner.logits_for([_entry(ids, 0, table)])
        finally:
            blocks.free(table)
        with torch.no_grad():
            theirs = hf_model(torch.tensor([ids])).logits[0]
        assert (ours - theirs).abs().max().item() <= 1e-4, prompt


def test_decode_steps_reuse_the_kv_cache(engine, hf_model):
    """Prefill half the prompt, then feed one token at a time: each step's logits equal HF's."""
    ids = engine.tokenizer.encode(PROMPTS[1] + " " + PROMPTS[3])
    split = len(ids) // 2
    blocks = engine.block_manager
    table = blocks.allocate(-(-len(ids) // blocks.block_size))
    try:
        steps = [engine.runner.logits_for([_entry(ids[:split], 0, table)])[-1]]
        for pos in range(split, len(ids)):
            steps.append(engine.runner.logits_for([_entry([ids[pos]], pos, table)])[0])
    finally:
        blocks.free(table)
    with torch.no_grad():
        theirs = hf_model(torch.tensor([ids])).logits[0, split - 1 :]
    assert (torch.stack(steps) - theirs).abs().max().item() <= 1e-4


def test_batched_mixed_prefill_and_decode_logits(engine, hf_model):
    """One forward pass holding a prefill, a prefill chunk on a cached prefix, and a decode."""
    a, b, c = (engine.tokenizer.encode(p) for p in PROMPTS[:3])
    blocks = engine.block_manager
    tables = [blocks.allocate(-(-len(x) // blocks.block_size)) for x in (a, b, c)]
    try:
        engine.runner.logits_for([_entry(b[:5], 0, tables[1]), _entry(c[:-1], 0, tables[2])])
        ours = engine.runner.logits_for(
            [_entry(a, 0, tables[0]), _entry(b[5:], 5, tables[1]), _entry(c[-1:], len(c) - 1, tables[2])]
        )
    finally:
        for t in tables:
            blocks.free(t)
    with torch.no_grad():
        expected = torch.cat(
            [
                hf_model(torch.tensor([a])).logits[0],
                hf_model(torch.tensor([b])).logits[0, 5:],
                hf_model(torch.tensor([c])).logits[0, -1:],
            ]
        )
    assert (ours - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_match_hf(engine, hf_model, prompt):
    ids = engine.tokenizer.encode(prompt)
    expected = hf_greedy(hf_model, ids, 24)
    [out] = engine.generate([prompt], SamplingParams(max_new_tokens=24, stop_on_eos=False))
    assert out.token_ids == expected
    assert len(set(expected)) > 5  # the reference model really wanders


def test_hf_generate_agrees(engine, hf_model):
    """The same check through HF's own generate() with its KV cache."""
    ids = engine.tokenizer.encode(PROMPTS[0])
    with torch.no_grad():
        hf_out = hf_model.generate(
            torch.tensor([ids]),
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    [out] = engine.generate([ids], SamplingParams(max_new_tokens=20, stop_on_eos=False))
    assert out.token_ids == hf_out[0, len(ids) :].tolist()
