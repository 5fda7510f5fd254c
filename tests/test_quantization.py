"""int8 weights (EngineConfig.quantization): each int8 kernel against its exact oracle. "int8" (int8 weights and
activations, linear_w8a8.c): the same arithmetic written in torch, on every CPU class's code path this machine can
run. "int8-weight-only" (linear_f32.c's linear_i8): the fp32 model with the dequantized weights. Agreement with
the fp32 model itself is measured (benchmarks/benchmark_cpu_linear.py), not assumed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_classes import (
    build_classes,  # the w8a8 kernel: AVX2's build is vpmaddubsw's, the portable one plain C
)

import roseinfer.models.packed_linear as packed_linear
from roseinfer import InferenceEngine, SamplingParams
from roseinfer.kernels.cpu.bindings import (
    W8A8_KERNEL_SOURCE,
    bind_w8a8,
    i8_linear,
    load_f32_linear_kernel,
    load_w8a8_linear_kernel,
    pad_to_panels,
    quantize_i8_panels,
    quantize_w8a8_panels,
    unpack_f32_panels,
    unpack_w8a8_panels,
    w8a8_linear,
)
from roseinfer.kernels.cpu.build import load_kernel_library
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
    layer = PackedLinear(weight, bias, "gelu_tanh", cpu_linear="int8-weight-only")
    saved = layer.state_dict()
    assert layer.kernel == "int8-weight-only" and layer._weight.dtype == torch.int8
    assert (saved["weight"] - weight).abs().max() <= weight.abs().max() / 254 + 1e-7 and torch.equal(saved["bias"], bias)
    x = torch.randn(3, 24)
    assert torch.allclose(layer(x), F.gelu(F.linear(x, saved["weight"], bias), approximate="tanh"), atol=1e-5)


def test_the_int8_weight_only_engine_matches_its_fp32_oracle(hf_tiny_dir):
    int8 = InferenceEngine.from_pretrained(str(hf_tiny_dir), quantization="int8-weight-only")
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
    (dict(quantization="int8-weight-only", dtype="bfloat16"), "in fp32"),
])
def test_int8_is_refused_where_it_cannot_run(options, message):
    with pytest.raises(ValueError, match=message):
        InferenceEngine.from_pretrained("gpt2-tiny", **options)


# --- int8 weights and activations (linear_w8a8.c) ---

def w8a8_reference(x, packed, scale, colsum, bias, gelu, n, k, qmax):
    """linear_w8a8.c's arithmetic in torch: x quantized per row (rint(x qmax / max|x|), scale max|x| / qmax),
    exact integer products, then the per-row and per-column scales and the bias, in the kernel's order."""
    weight = unpack_w8a8_panels(packed, n)[:, :k].double()
    amax = x.abs().amax(dim=1, keepdim=True)
    qx = torch.round(x * torch.where(amax > 0, qmax / amax, torch.zeros_like(amax)))
    sx = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    y = (qx.double() @ weight.T).float() * sx * scale[:n]
    y = y + bias[:n] if bias is not None else y
    return F.gelu(y, approximate="tanh") if gelu else y


@pytest.fixture(scope="module", params=build_classes(), ids=lambda c: c[0])
def w8a8_lib(request, tmp_path_factory):
    if request.param[1] is None:
        yield load_w8a8_linear_kernel()
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROSEINFER_KERNEL_MARCH", request.param[1])
        lib = load_kernel_library(W8A8_KERNEL_SOURCE, "int8 projection", "none")
    if lib is None:
        pytest.skip(f"the {request.param[0]} class's kernel does not build here")
    yield bind_w8a8(lib)


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 6, 13, 25])  # one pass (up to 5 or 12 rows) and several
@pytest.mark.parametrize("n, k", [(96, 64), (50, 33), (3, 7), (40, 1030)])  # K not a multiple of 4
def test_the_w8a8_kernel_is_its_arithmetic_in_torch(w8a8_lib, n, k, rows, gelu, monkeypatch):
    columns, qmax = w8a8_lib.linear_w8a8_panel_columns(), w8a8_lib.linear_w8a8_activation_max()
    gen = torch.Generator().manual_seed(n + k + rows)
    weight, bias = torch.randn(n, k, generator=gen) * 0.1, torch.randn(n, generator=gen)
    weight[0] = 0  # an all-zero channel: no division by a zero scale
    x = torch.randn(rows, k, generator=gen) * 3
    x[0] = 0  # an all-zero row: its scale is 1, its products 0
    packed, scale, colsum = quantize_w8a8_panels(weight, columns)
    assert (unpack_w8a8_panels(packed, n)[:, k:] == 0).all()  # the padding of K adds nothing
    padded_bias = pad_to_panels(bias, columns)
    want = w8a8_reference(x, packed, scale, colsum, bias, gelu, n, k, qmax)
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        got = w8a8_linear(x, packed, scale, colsum, padded_bias, gelu, n, k, lib=w8a8_lib)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    # int8 on both sides: within a few quantization steps of fp32 (4 % of the output's scale here)
    assert (got - reference(x, weight, bias, gelu).float()).abs().max() <= 0.04 * want.abs().max() + 1e-3
    with pytest.raises(ValueError, match="does not fit"):  # x narrower than the K it is said to have
        w8a8_linear(x[:, :-1], packed, scale, colsum, None, gelu, n, k, lib=w8a8_lib)
    with pytest.raises(ValueError, match="does not fit"):  # K4 differs: the kernel would read past a panel
        w8a8_linear(x[:, :-4], packed, scale, colsum, None, gelu, n, k - 4, lib=w8a8_lib)
    with pytest.raises(ValueError, match="does not fit"):  # column sums not padded to whole panels
        w8a8_linear(x, packed, scale, colsum[:-1], None, gelu, n, k, lib=w8a8_lib)


def test_the_w8a8_kernel_takes_an_empty_step():
    packed, scale, colsum = quantize_w8a8_panels(torch.randn(8, 16), load_w8a8_linear_kernel().linear_w8a8_panel_columns())
    assert w8a8_linear(torch.empty(0, 16), packed, scale, colsum, None, False, 8, 16).shape == (0, 8)


def test_the_int8_engine_matches_its_arithmetic_in_torch(hf_tiny_dir, monkeypatch):
    """Every projection and the LM head on the kernel, against the same engine with each call computed by
    w8a8_reference: the same logits (to float rounding) and the same greedy tokens."""
    int8 = InferenceEngine.from_pretrained(str(hf_tiny_dir), quantization="int8")
    assert int8.dtype == torch.float32 and int8.runner.model.__dict__["_packed_lm_head"].kernel == "int8"
    ids = int8.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    params = SamplingParams(max_new_tokens=12, stop_on_eos=False)
    prompts = ["hello there", "a b c d e f g h", "x"]
    ours, our_tokens = int8.prompt_logits(ids), [o.token_ids for o in int8.generate(prompts, params)]
    qmax = load_w8a8_linear_kernel().linear_w8a8_activation_max()
    calls = []

    def in_torch(x, packed, scale, colsum, bias, gelu, n, k):
        calls.append(n)
        return w8a8_reference(x, packed, scale, colsum, bias, gelu, n, k, qmax)

    monkeypatch.setattr(packed_linear, "w8a8_linear", in_torch)
    theirs = int8.prompt_logits(ids)
    assert calls and (ours - theirs).abs().max() <= 1e-4 * theirs.abs().max()
    assert our_tokens == [o.token_ids for o in int8.generate(prompts, params)]
    fp32 = InferenceEngine.from_pretrained(str(hf_tiny_dir), dtype="float32").prompt_logits(ids)
    assert (ours - fp32).abs().max() <= 0.1 * fp32.abs().max()  # int8's error: small, not nothing
    assert not torch.equal(ours, fp32)
