"""int8 weights (EngineConfig.quantization="int8"): roseinfer's int8 kernel against its exact oracle, the
fp32 model with the dequantized weights; agreement with the fp32 model itself is measured, not assumed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.kernels.cpu.bindings import (
    i8_linear,
    load_f32_linear_kernel,
    quantize_i8_panels,
    unpack_f32_panels,
)
from roseinfer.models.packed_linear import PackedLinear

pytestmark = pytest.mark.skipif(load_f32_linear_kernel() is None, reason="no C compiler: no int8 kernel")


def reference(x, weight, bias, gelu):
    y = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    return F.gelu(y, approximate="tanh") if gelu else y


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 5, 17])  # streamed (up to 4 rows) and widened once a panel (more)
@pytest.mark.parametrize("n, k", [(96, 64), (50, 33), (3, 7)])
def test_the_int8_kernel_computes_with_the_dequantized_weights(n, k, rows, gelu, monkeypatch):
    columns = load_f32_linear_kernel().linear_f32_panel_columns()
    gen = torch.Generator().manual_seed(n + k + rows)
    weight, bias = torch.randn(n, k, generator=gen) * 0.1, torch.randn(n, generator=gen)
    weight[0] = 0  # an all-zero channel: no division by a zero scale
    packed, scale = quantize_i8_panels(weight, columns)
    dequantized = unpack_f32_panels(packed, n).float() * scale[:n, None]
    assert (dequantized - weight).abs().max() <= weight.abs().max() / 254 + 1e-7  # half a step of 127
    padded_bias = torch.zeros(scale.numel())
    padded_bias[:n] = bias
    x = torch.randn(rows, k, generator=gen)
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        got = i8_linear(x, packed, scale, padded_bias, gelu, n)
        assert torch.allclose(got.double(), reference(x, dequantized, bias, gelu), atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="does not fit"):  # K differs: the kernel would read past a panel
        i8_linear(x[:, :-1], packed, scale, None, gelu, n)
    with pytest.raises(ValueError, match="does not fit"):  # a scale not padded to whole panels
        i8_linear(x, packed, scale[:n] if n % columns else scale[:-1], None, gelu, n)


def test_an_int8_layer_saves_its_dequantized_weights():
    weight, bias = torch.randn(40, 24) * 0.1, torch.randn(40)
    layer = PackedLinear(weight, bias, "gelu_tanh", cpu_linear="int8")
    saved = layer.state_dict()
    assert layer.kernel == "int8" and layer._weight.dtype == torch.int8
    assert (saved["weight"] - weight).abs().max() <= weight.abs().max() / 254 + 1e-7 and torch.equal(saved["bias"], bias)
    x = torch.randn(3, 24)
    assert torch.allclose(layer(x), F.gelu(F.linear(x, saved["weight"], bias), approximate="tanh"), atol=1e-5)


def test_the_int8_engine_matches_its_fp32_oracle(hf_tiny_dir):
    int8 = InferenceEngine.from_pretrained(str(hf_tiny_dir), quantization="int8")
    assert int8.dtype == torch.float32
    # the oracle: the plain fp32 model on the dequantized weights, its LM head the dequantized embedding
    head = int8.runner.model.__dict__["_packed_lm_head"].state_dict()["weight"]
    oracle = InferenceEngine.from_pretrained(str(hf_tiny_dir), dtype="float32", cpu_linear="torch")
    oracle.runner.model.load_state_dict(int8.runner.model.state_dict())
    oracle.runner.model.__dict__["_packed_lm_head"] = lambda hidden: F.linear(hidden, head)
    ids = int8.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    ours, theirs = int8.prompt_logits(ids), oracle.prompt_logits(ids)
    assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    params = SamplingParams(max_new_tokens=12, stop_on_eos=False)
    prompts = ["hello there", "a b c d e f g h", "x"]
    assert [o.token_ids for o in int8.generate(prompts, params)] == [o.token_ids for o in oracle.generate(prompts, params)]


@pytest.mark.parametrize("options, message", [
    (dict(quantization="int4"), "quantization must be"),
    (dict(quantization="int8", dtype="bfloat16"), "in fp32"),
    (dict(quantization="int8", compile_decode=True), "runs eagerly"),
])
def test_int8_is_refused_where_it_cannot_run(options, message):
    with pytest.raises(ValueError, match=message):
        InferenceEngine.from_pretrained("gpt2-tiny", **options)
