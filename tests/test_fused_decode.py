"""A decode step's layers in one C call (models/fused_decode.py) against the layer-by-layer loop.

The C loop calls the same kernels in the same order, so its logits must be the loop's bit for bit, for
every shape of test_llama.py's cases (grouped-query ratios, head sizes, Qwen2's q/k/v biases), in fp32 and,
where the CPU runs roseinfer's bf16 kernel, bf16. A tiny GPT-2 (biases everywhere, GELU in c_fc's kernel)
differs only by the LayerNorm (the loop's is torch's, the C loop's pointwise.c's): within its rounding. The
C loop must take only the steps it can, give the same greedy tokens, and refuse a bad block table as the
loop does.
"""

from __future__ import annotations

import pytest
import torch
from test_llama import CASES, PROMPTS, build_hf

from conftest import build_hf_tiny
from roseinfer import InferenceEngine, SamplingParams
from roseinfer.engine.batch import BatchEntry
from roseinfer.kernels.cpu.bindings import load_bf16_linear_kernel, load_decode_layers_kernel
from roseinfer.models import fused_decode, packed_linear

pytestmark = pytest.mark.skipif(load_decode_layers_kernel() is None, reason="no C compiler for the CPU kernels")
DTYPES = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    load_bf16_linear_kernel() is None, reason="roseinfer's bf16 kernel needs AVX512-BF16"))]
SMALL_ROWS = 4  # fp32 projections of up to this many rows on roseinfer's kernel, whatever this CPU's probe says


def gpt2_with_every_bias() -> torch.nn.Module:
    """A tiny GPT-2 whose norms and biases are not HF's ones and zeros, so a bias the C loop missed shows."""
    model = build_hf_tiny()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif ".ln_" in name:
                param.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module", params=[*sorted(CASES), "gpt2"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    (gpt2_with_every_bias() if request.param == "gpt2" else build_hf(request.param)).save_pretrained(path)
    return path


def _engine(path, monkeypatch, **config) -> InferenceEngine:
    monkeypatch.setattr(packed_linear, "fp32_small_rows", lambda: ("roseinfer", SMALL_ROWS))
    monkeypatch.setattr(packed_linear, "fp32_fused_rows", lambda: SMALL_ROWS)  # one-call steps no wider either
    return InferenceEngine.from_pretrained(str(path), **{"num_kv_blocks": 64, **config})


def _entry(tokens, start, table):
    return BatchEntry(tokens, start, table, False, SamplingParams(), None)


def _count_fused(monkeypatch) -> list[bool]:
    """What FusedDecode.run answered, step by step (True: the C loop ran the layers)."""
    answers = []
    run = fused_decode.FusedDecode.run

    def counted(self, *args):
        answers.append(run(self, *args))
        return answers[-1]

    monkeypatch.setattr(fused_decode.FusedDecode, "run", counted)
    return answers


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_steps_are_the_layer_loops_bit_for_bit(checkpoint, dtype, monkeypatch):
    engine = _engine(checkpoint, monkeypatch, dtype=dtype)
    assert engine.runner.model.__dict__["_fused_decode"] is not None
    answers = _count_fused(monkeypatch)
    blocks = engine.block_manager
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS[:3]]
    new = 6  # past a 16-token block's end for the longest prompt
    tables = [blocks.allocate(-(-(len(p) + new) // blocks.block_size)) for p in prompts]
    try:
        engine.runner.logits_for([_entry(p, 0, t) for p, t in zip(prompts, tables)])  # prefill: the loop
        assert answers == [False]
        tokens = [p[-1] for p in prompts]
        for step in range(new):
            batch = [_entry([tok], len(p) + step, t) for tok, p, t in zip(tokens, prompts, tables)]
            for rows in (batch[:1], batch):  # batch 1, then every sequence
                monkeypatch.setattr(fused_decode, "enabled", True)
                fused = engine.runner.logits_for(rows)
                monkeypatch.setattr(fused_decode, "enabled", False)  # (writes the same K/V at the same slots)
                loop = engine.runner.logits_for(rows)
                if checkpoint.name.startswith("gpt2"):  # LayerNorm's rounding, carried through two layers
                    tolerance = 1e-4 if dtype == "float32" else 0.05 * loop.abs().max().item()
                    torch.testing.assert_close(fused, loop, rtol=0, atol=tolerance)
                else:
                    assert torch.equal(fused, loop), f"step {step}, batch {len(rows)}"
            tokens = fused.argmax(-1).tolist()
    finally:
        for t in tables:
            blocks.free(t)
    assert answers[1::2] == [True] * 2 * new and not any(answers[2::2])


def test_greedy_tokens_and_what_takes_the_loop(checkpoint, monkeypatch):
    """Greedy generation is the same either way; steps of more rows than the fp32 kernel's, prefills and
    engines whose projections are not roseinfer's own run the loop."""
    params = SamplingParams(max_new_tokens=20, stop_on_eos=False)
    engine = _engine(checkpoint, monkeypatch)
    answers = _count_fused(monkeypatch)
    few, many = PROMPTS[:3], PROMPTS * 2  # 3 sequences a decode step, then 8: more rows than SMALL_ROWS
    fused = [[o.token_ids for o in engine.generate(prompts, params)] for prompts in (few, many)]
    assert answers.count(True) == params.max_new_tokens - 1 and answers.count(False) > params.max_new_tokens
    monkeypatch.setattr(fused_decode, "enabled", False)
    assert fused == [[o.token_ids for o in engine.generate(prompts, params)] for prompts in (few, many)]
    assert _engine(checkpoint, monkeypatch, quantization="int8").runner.model.__dict__["_fused_decode"] is None
    assert _engine(checkpoint, monkeypatch, cpu_linear="onednn").runner.model.__dict__["_fused_decode"] is None


def test_steps_past_the_small_rows_run_in_one_call_where_the_probe_allows(checkpoint, monkeypatch):
    """fp32 steps of more rows than the kernel's small ones go to the C loop up to fused_rows (the Python loop
    runs oneDNN there, so the two agree within rounding), and to the loop past it."""
    monkeypatch.setattr(packed_linear, "fp32_fused_rows", lambda: 12)
    monkeypatch.setattr(packed_linear, "fp32_small_rows", lambda: ("roseinfer", packed_linear.SMALL_ROWS_PROBE[-1]))
    engine = InferenceEngine.from_pretrained(str(checkpoint), num_kv_blocks=64, dtype="float32")
    assert engine.runner.model.__dict__["_fused_decode"].max_rows == 12
    answers = _count_fused(monkeypatch)
    blocks = engine.block_manager
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS * 4][:13]
    tables = [blocks.allocate(-(-(len(p) + 1) // blocks.block_size)) for p in prompts]
    try:
        for p, t in zip(prompts, tables):
            engine.runner.logits_for([_entry(p, 0, t)])
        step = [_entry([p[-1]], len(p), t) for p, t in zip(prompts, tables)]
        fused = engine.runner.logits_for(step[:12])
        monkeypatch.setattr(fused_decode, "enabled", False)
        loop = engine.runner.logits_for(step[:12])
        monkeypatch.setattr(fused_decode, "enabled", True)
        engine.runner.logits_for(step)  # 13 rows: past fused_rows
    finally:
        for t in tables:
            blocks.free(t)
    assert answers[len(prompts):] == [True, False, False]  # (the second: the C loop disabled)
    torch.testing.assert_close(fused, loop, rtol=0, atol=1e-4)


def test_a_bad_block_table_is_the_loops_error(checkpoint, monkeypatch):
    engine = _engine(checkpoint, monkeypatch)
    blocks = engine.block_manager
    table = blocks.allocate(1)
    try:
        engine.runner.logits_for([_entry([5, 6, 7], 0, table)])
        bad = [_entry([9], 3, table), _entry([9], 20, table + [10_000])]  # the second's block is not in the cache
        errors = []
        for enabled in (True, False):
            monkeypatch.setattr(fused_decode, "enabled", enabled)
            with pytest.raises(IndexError, match="outside the KV cache") as caught:
                engine.runner.logits_for(bad)
            errors.append(str(caught.value))
    finally:
        blocks.free(table)
    assert errors[0] == errors[1]
