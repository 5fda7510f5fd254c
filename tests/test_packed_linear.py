"""The CPU projections: oneDNN's packed kernel and roseinfer's bf16 kernel (kernels/cpu/linear_bf16.c)."""

import os

import pytest
import torch
import torch.nn.functional as F

from roseinfer.models import packed_linear
from roseinfer.models.packed_linear import PackedLinear, load_bf16_linear_kernel, pack_panels, unpack_panels

needs_bf16_kernel = pytest.mark.skipif(
    load_bf16_linear_kernel() is None, reason="this CPU has no AVX512-BF16 (or no C compiler): oneDNN's kernel only"
)


@pytest.fixture
def roseinfer_kernel(monkeypatch):
    """roseinfer's kernel for the layers a test builds, whatever the CPU's default (oneDNN's where it has AMX)."""
    monkeypatch.setenv("ROSEINFER_CPU_LINEAR", "roseinfer")


def reference(x, weight, bias, activation):
    y = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    return F.gelu(y, approximate="tanh") if activation == "gelu_tanh" else y


@needs_bf16_kernel
@pytest.mark.parametrize("activation", ["none", "gelu_tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("out_features", [37, 96])  # a partial panel of 32 columns, whole panels
@pytest.mark.parametrize("rows", [1, 13, 50])  # one pass; passes of 12 rows; more than a 48-row tile
@pytest.mark.usefixtures("roseinfer_kernel")
def test_bf16_kernel_matches_a_float64_reference(activation, with_bias, out_features, rows):
    torch.manual_seed(rows * 100 + out_features)
    weight = (torch.randn(out_features, 64) * 0.2).bfloat16()
    bias = torch.randn(out_features).bfloat16() if with_bias else None
    layer = PackedLinear(weight, bias, activation)
    assert layer.kernel == "roseinfer"
    x = torch.randn(rows, 64).bfloat16()
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, out_features)
    expected = reference(x, weight, bias, activation)
    # fp32 sums of exact bf16 products, then one rounding to bf16 (relative 2^-8)
    assert ((y.double() - expected).abs() <= 2**-8 * expected.abs() + 1e-3).all()


@needs_bf16_kernel
@pytest.mark.usefixtures("roseinfer_kernel")
def test_bf16_kernel_rows_do_not_depend_on_the_batch():
    """Each row's sums run in the same order whatever pass it falls in: batched equals solo, bit for bit."""
    torch.manual_seed(0)
    layer = PackedLinear((torch.randn(70, 128) * 0.1).bfloat16(), torch.randn(70).bfloat16())
    x = torch.randn(29, 128).bfloat16()
    batched = layer(x)
    for i in (0, 11, 12, 28):
        assert torch.equal(layer(x[i : i + 1]), batched[i : i + 1])


@needs_bf16_kernel
@pytest.mark.usefixtures("roseinfer_kernel")
def test_bf16_kernel_reads_strided_rows_and_keeps_the_state_dict_dense():
    torch.manual_seed(1)
    weight, bias = (torch.randn(40, 64) * 0.1).bfloat16(), torch.randn(40).bfloat16()
    layer = PackedLinear(weight, bias)
    wide = torch.randn(5, 3 * 64).bfloat16()
    rows = wide[:, 64:128]  # a view: rows 192 elements apart
    assert torch.equal(layer(rows), layer(rows.contiguous()))
    state = layer.state_dict()
    assert torch.equal(state["weight"], weight) and torch.equal(state["bias"], bias)
    fresh = PackedLinear(torch.zeros_like(weight), torch.zeros_like(bias))
    fresh.load_state_dict(state)
    assert torch.equal(fresh(rows), layer(rows))


def test_panels_round_trip():
    weight = torch.arange(70 * 6, dtype=torch.float32).view(70, 6)
    packed = pack_panels(weight, 32)
    assert packed.shape == (3, 3, 32, 2)  # 70 columns in 3 panels, 6 = 3 pairs of k
    assert packed[0, 1, 5].tolist() == [weight[5, 2].item(), weight[5, 3].item()]
    assert torch.equal(unpack_panels(packed, 70), weight)


def test_onednn_can_be_chosen_for_bf16(monkeypatch):
    monkeypatch.setenv("ROSEINFER_CPU_LINEAR", "onednn")
    if not packed_linear.packing_available(torch.device("cpu"), torch.bfloat16):
        pytest.skip("no bf16 oneDNN on this CPU")
    torch.manual_seed(2)
    weight, bias = (torch.randn(48, 64) * 0.1).bfloat16(), torch.randn(48).bfloat16()
    layer = PackedLinear(weight, bias, "gelu_tanh")
    assert layer.kernel == "onednn"
    x = torch.randn(3, 64).bfloat16()
    expected = reference(x, weight, bias, "gelu_tanh")
    assert ((layer(x).double() - expected).abs() <= 2**-7 * expected.abs() + 2e-3).all()


@needs_bf16_kernel
@pytest.mark.parametrize("cols", [50257, 31, 64, 33])
def test_bf16_argmax_equals_torch_on_ties_negatives_and_nan(cols):
    torch.manual_seed(cols)
    cases = [
        torch.randn(5, cols) * 10,
        torch.randn(5, cols) * 0.01 - 5,  # all negative: the masked tail must not win
        torch.full((3, cols), -3.0),  # all tied: the first index
    ]
    with_nan = torch.randn(2, cols)
    with_nan[1, cols // 2] = float("nan")  # torch picks a NaN
    cases.append(with_nan)
    for logits in cases:
        logits = logits.bfloat16()
        assert torch.equal(packed_linear.argmax_bf16(logits), logits.float().argmax(dim=-1))
    assert packed_linear.argmax_bf16(torch.randn(2, cols)) is None  # fp32: torch's own argmax


def test_cpu_linear_restores_the_environment(monkeypatch):
    from roseinfer.models.packed_linear import cpu_linear

    monkeypatch.setenv("ROSEINFER_CPU_LINEAR", "roseinfer")
    with cpu_linear("onednn"):
        assert os.environ["ROSEINFER_CPU_LINEAR"] == "onednn"
    assert os.environ["ROSEINFER_CPU_LINEAR"] == "roseinfer"
    monkeypatch.delenv("ROSEINFER_CPU_LINEAR")
    with cpu_linear("roseinfer"):
        assert os.environ["ROSEINFER_CPU_LINEAR"] == "roseinfer"
    assert "ROSEINFER_CPU_LINEAR" not in os.environ


def test_cpu_linear_picks_the_kernel_and_restores_the_environment(monkeypatch):
    from roseinfer.models.packed_linear import cpu_linear

    if not packed_linear.packing_available(torch.device("cpu"), torch.bfloat16):
        pytest.skip("oneDNN cannot pack bf16 weights on this CPU (it needs AVX512-BW/VL/DQ or AVX-NE-CONVERT)")
    monkeypatch.setenv("ROSEINFER_CPU_LINEAR", "roseinfer")
    weight = torch.randn(64, 32).bfloat16()
    with cpu_linear("onednn"):
        assert PackedLinear(weight, None).kernel == "onednn"
    assert os.environ["ROSEINFER_CPU_LINEAR"] == "roseinfer"  # what was there before, back
    monkeypatch.delenv("ROSEINFER_CPU_LINEAR")
    with cpu_linear("roseinfer"):
        expected = "roseinfer" if load_bf16_linear_kernel() is not None else "onednn"
        assert PackedLinear(weight, None).kernel == expected
    assert "ROSEINFER_CPU_LINEAR" not in os.environ
    with pytest.raises(ValueError, match="roseinfer"), cpu_linear("mkl"):
        pass


def test_bf16_projections_go_to_onednn_on_an_amx_cpu(monkeypatch):
    # where the kernel can run: ours by default, oneDNN's where the CPU has AMX tiles, the variable overriding both
    if load_bf16_linear_kernel() is None:
        pytest.skip("roseinfer's bf16 kernel cannot run on this CPU (no AVX512-BF16 or no compiler)")
    monkeypatch.delenv("ROSEINFER_CPU_LINEAR", raising=False)
    weight = torch.randn(64, 32).bfloat16()
    for amx, default in ((False, "roseinfer"), (True, "onednn")):
        monkeypatch.setattr(packed_linear, "amx_bf16_cpu", lambda amx=amx: amx)
        assert PackedLinear(weight, None).kernel == default
        for choice in ("roseinfer", "onednn"):
            monkeypatch.setenv("ROSEINFER_CPU_LINEAR", choice)
            assert PackedLinear(weight, None).kernel == choice
        monkeypatch.delenv("ROSEINFER_CPU_LINEAR")
    assert not packed_linear.bf16_kernel_wanted(torch.float32)  # fp32 is oneDNN's whatever the CPU
