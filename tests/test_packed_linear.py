"""The CPU projections: oneDNN's packed kernel, roseinfer's bf16 kernel (kernels/cpu/linear_bf16.c), F.linear."""

import pytest
import torch
import torch.nn.functional as F

from roseinfer.config import EngineConfig
from roseinfer.kernels.cpu.bindings import (
    argmax_bf16,
    f32_linear,
    load_bf16_linear_kernel,
    load_f32_linear_kernel,
    pack_f32_panels,
    pack_panels,
    unpack_f32_panels,
    unpack_panels,
)
from roseinfer.models import packed_linear
from roseinfer.models.packed_linear import PackedLinear

needs_bf16_kernel = pytest.mark.skipif(
    load_bf16_linear_kernel() is None, reason="this CPU has no AVX512-BF16 (or no C compiler): oneDNN's kernel only"
)


@pytest.fixture
def roseinfer_kernel(monkeypatch):
    """roseinfer's kernel for the layers a test builds, whatever the CPU's default (oneDNN's where it has AMX)."""
    monkeypatch.setattr(packed_linear, "amx_bf16_cpu", lambda: False)


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


def test_onednn_can_be_chosen_for_bf16():
    if not packed_linear.packing_available(torch.device("cpu"), torch.bfloat16):
        pytest.skip("no bf16 oneDNN on this CPU")
    torch.manual_seed(2)
    weight, bias = (torch.randn(48, 64) * 0.1).bfloat16(), torch.randn(48).bfloat16()
    layer = PackedLinear(weight, bias, "gelu_tanh", cpu_linear="onednn")
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
        assert torch.equal(argmax_bf16(logits), logits.float().argmax(dim=-1))
    assert argmax_bf16(torch.randn(2, cols)) is None  # fp32: torch's own argmax


def test_the_choice_is_a_config_field_the_variable_overrides_when_the_config_is_built(monkeypatch):
    monkeypatch.delenv("ROSEINFER_CPU_LINEAR", raising=False)
    assert EngineConfig().cpu_linear == "auto"
    monkeypatch.setenv("ROSEINFER_CPU_LINEAR", "OneDNN")
    config = EngineConfig()
    monkeypatch.delenv("ROSEINFER_CPU_LINEAR")
    assert config.cpu_linear == "onednn"  # read once, when the config was built
    assert EngineConfig(cpu_linear="torch").cpu_linear == "torch"


def test_an_unknown_choice_is_refused_and_torch_means_f_linear():
    weight, bias = torch.randn(48, 64), torch.randn(48)
    with pytest.raises(ValueError, match="cpu_linear"):
        PackedLinear(weight, bias, cpu_linear="mkl")
    layer = PackedLinear(weight, bias, "gelu_tanh", cpu_linear="torch")
    assert layer.kernel == "torch" and layer._dense.data_ptr() == weight.data_ptr()  # no copy
    x = torch.randn(5, 64)
    assert torch.equal(layer(x), F.gelu(F.linear(x, weight, bias), approximate="tanh"))
    assert torch.equal(layer.state_dict()["weight"], weight)


def test_bf16_projections_go_to_onednn_on_an_amx_cpu(monkeypatch):
    # where the kernel can run: ours by default, oneDNN's where the CPU has AMX tiles, the variable overriding both
    if load_bf16_linear_kernel() is None:
        pytest.skip("roseinfer's bf16 kernel cannot run on this CPU (no AVX512-BF16 or no compiler)")
    weight = torch.randn(64, 32).bfloat16()
    for amx, default in ((False, "roseinfer"), (True, "onednn")):
        monkeypatch.setattr(packed_linear, "amx_bf16_cpu", lambda amx=amx: amx)
        assert PackedLinear(weight, None).kernel == default
        for choice in ("roseinfer", "onednn"):
            assert PackedLinear(weight, None, cpu_linear=choice).kernel == choice
    assert not packed_linear.bf16_kernel_wanted(torch.float32)  # fp32 is oneDNN's whatever the CPU


def seconds(torch_s, onednn_s, roseinfer_s=None):
    return {"torch": torch_s, "onednn": onednn_s} | ({} if roseinfer_s is None else {"roseinfer": roseinfer_s})


def test_the_fp32_row_threshold_is_where_the_small_path_stops_winning():
    choice = packed_linear.small_rows_choice
    # F.linear wins at 1 and 2, loses at 4 (no roseinfer kernel built)
    timings = {1: seconds(30e-6, 80e-6), 2: seconds(40e-6, 85e-6), 4: seconds(90e-6, 88e-6), 8: seconds(10e-6, 99e-6)}
    assert choice(timings.__getitem__) == ("torch", 2)  # one threshold: stops at the first loss
    assert choice(lambda rows: seconds(2.0, 1.0)) == ("torch", 0)  # oneDNN wins everywhere
    assert choice(lambda rows: seconds(1.0, 2.0)) == ("torch", packed_linear.SMALL_ROWS_PROBE[-1])
    # roseinfer's kernel takes the small rows where it beats F.linear at one row, and is held to oneDNN itself
    assert choice(lambda rows: seconds(3.0, 2.0, 1.0)) == ("roseinfer", packed_linear.SMALL_ROWS_PROBE[-1])
    by_rows = {1: seconds(3.0, 2.0, 1.0), 2: seconds(3.0, 2.0, 1.4), 4: seconds(3.0, 2.0, 1.7)}
    assert choice(by_rows.__getitem__) == ("roseinfer", 2)  # a win under the margin at 4 rows is not a win
    assert choice(lambda rows: seconds(1.0, 2.0, 1.5)) == ("torch", packed_linear.SMALL_ROWS_PROBE[-1])
    # one row: roseinfer's kernel need only beat oneDNN (it also opens the one-call decode step); F.linear still
    # needs the margin, and more rows do
    by_rows = {1: seconds(3.0, 2.0, 1.8), 2: seconds(3.0, 2.0, 1.4), 4: seconds(3.0, 2.0, 1.7)}
    assert choice(by_rows.__getitem__) == ("roseinfer", 2)
    assert choice(lambda rows: seconds(3.0, 2.0, 2.1)) == ("roseinfer", 0)  # slower than oneDNN: no small rows
    assert choice(lambda rows: seconds(1.8, 2.0)) == ("torch", 0)


def test_one_call_steps_extend_the_kernels_rows_while_it_keeps_up_with_onednn():
    choice = packed_linear.fused_rows_choice
    last = packed_linear.SMALL_ROWS_PROBE[-1]
    near = packed_linear.FUSED_ROWS_MARGIN * 0.99
    level = {count: seconds(9.0, 1.0, near) for count in packed_linear.FUSED_ROWS_PROBE}
    assert choice(("roseinfer", last), level.__getitem__) == packed_linear.FUSED_ROWS_PROBE[-1]
    # stops at the first count past the margin, even if a later one is back under it
    fall = dict(level) | {packed_linear.FUSED_ROWS_PROBE[1]: seconds(9.0, 1.0, packed_linear.FUSED_ROWS_MARGIN * 1.01)}
    assert choice(("roseinfer", last), fall.__getitem__) == packed_linear.FUSED_ROWS_PROBE[0]
    assert choice(("roseinfer", last), lambda count: seconds(9.0, 1.0, 2.0)) == last
    # counts past the small rows only; nothing where roseinfer's kernel took no small rows, or F.linear took them
    probed = []
    assert choice(("roseinfer", 4), lambda count: probed.append(count) or level[count]) == \
        packed_linear.FUSED_ROWS_PROBE[-1]
    assert probed == [count for count in packed_linear.FUSED_ROWS_PROBE if count > 4]
    probed.clear()
    for small in (("roseinfer", 0), ("torch", last)):
        assert choice(small, lambda count: probed.append(count) or level[count]) == small[1]
    assert probed == []


def test_the_fp32_choice_is_measured_once_a_process(monkeypatch):
    real_timer = packed_linear._time_fp32_linears
    calls = []
    monkeypatch.setattr(packed_linear, "_time_fp32_linears", lambda rows: calls.append(rows) or seconds(1.0, 2.0))
    packed_linear.fp32_small_rows.cache_clear()
    try:
        weight = torch.randn(16, 8)
        assert PackedLinear(weight, None).small_rows == PackedLinear(weight, None).small_rows == 8
        assert calls == list(packed_linear.SMALL_ROWS_PROBE)
        assert PackedLinear(weight, None, cpu_linear="onednn").small_rows == 0  # a named kernel is not second-guessed
    finally:
        packed_linear.fp32_small_rows.cache_clear()
    measured = real_timer(1)  # the real timer runs and gives a duration per kernel
    assert set(measured) == {"torch", "onednn"} | ({"roseinfer"} if load_f32_linear_kernel() else set())
    assert all(t > 0 for t in measured.values())
    assert set(real_timer(16, repeats=2, with_torch=False)) == set(measured) - {"torch"}


def test_the_one_call_rows_reach_the_projections(monkeypatch):
    last = packed_linear.SMALL_ROWS_PROBE[-1]
    monkeypatch.setattr(packed_linear, "fp32_fused_rows", lambda: 32)
    weight = torch.randn(16, 8)
    for small, fused in ((("roseinfer", last), 32), (("roseinfer", 4), 32), (("roseinfer", 0), 0),
                         (("torch", last), last)):
        monkeypatch.setattr(packed_linear, "fp32_small_rows", lambda small=small: small)
        layer = PackedLinear(weight, None)
        assert (layer.small_rows, layer.fused_rows) == (small[1], fused)


needs_f32_kernel = pytest.mark.skipif(load_f32_linear_kernel() is None, reason="no C compiler: no fp32 kernel")


@needs_f32_kernel
@pytest.mark.parametrize("activation", ["none", "gelu_tanh"])
@pytest.mark.parametrize("rows", [1, 3, 4, 7])
@pytest.mark.parametrize("n, k", [(96, 64), (50, 33), (1, 5), (200, 768)])
def test_the_fp32_kernel_matches_f_linear(n, k, rows, activation, monkeypatch):
    """Every panel width's tail (n not a multiple of it), odd K, rows past one pass, 1 and 2 threads."""
    columns = load_f32_linear_kernel().linear_f32_panel_columns()
    assert columns in (8, 16, 32)  # two vectors: SSE/NEON, AVX2, AVX-512
    gen = torch.Generator().manual_seed(n * k + rows)
    weight, bias = torch.randn(n, k, generator=gen) * 0.1, torch.randn(n, generator=gen)
    panels = pack_f32_panels(weight, columns)
    assert torch.equal(unpack_f32_panels(panels, n), weight)
    padded_bias = torch.zeros(panels.shape[0] * columns)
    padded_bias[:n] = bias
    x = torch.randn(rows + 2, k, generator=gen)[1:-1]  # a row stride the kernel must follow
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        for b in (bias, None):
            got = f32_linear(x, panels, padded_bias if b is not None else None, activation == "gelu_tanh", n)
            assert torch.allclose(got.double(), reference(x, weight, b, activation), atol=2e-5, rtol=1e-5)


@needs_f32_kernel
def test_the_fp32_kernel_refuses_what_does_not_fit_its_panels():
    columns = load_f32_linear_kernel().linear_f32_panel_columns()
    panels = pack_f32_panels(torch.randn(40, 16), columns)
    with pytest.raises(ValueError, match="does not fit"):
        f32_linear(torch.randn(2, 17), panels, None, False, 40)  # K differs: the kernel would read past a panel
    with pytest.raises(ValueError, match="does not fit"):
        f32_linear(torch.randn(2, 16), panels, None, False, panels.shape[0] * columns + 1)
    with pytest.raises(ValueError, match="does not fit"):
        f32_linear(torch.randn(2, 16), panels, torch.zeros(40), False, 40)  # a bias not padded to whole panels


@needs_f32_kernel
def test_fp32_rows_up_to_the_threshold_take_roseinfers_kernel(monkeypatch):
    monkeypatch.setattr(packed_linear, "fp32_small_rows", lambda: ("roseinfer", 4))
    torch.manual_seed(3)
    weight, bias = torch.randn(96, 64) * 0.1, torch.randn(96)
    layer = PackedLinear(weight, bias, "gelu_tanh")
    assert layer.kernel == "onednn" and layer._dense is None and layer._panels is not None
    for rows in (1, 4, 9):  # the kernel up to 4 rows, oneDNN's above: both within fp32 rounding of F.linear
        x = torch.randn(rows, 64)
        assert torch.allclose(layer(x), F.gelu(F.linear(x, weight, bias), approximate="tanh"), atol=1e-5)
    assert torch.equal(layer.state_dict()["weight"], weight)  # checkpoints see the dense matrix


def test_fp32_rows_up_to_the_threshold_take_f_linear_on_the_same_weight(monkeypatch):
    monkeypatch.setattr(packed_linear, "fp32_small_rows", lambda: ("torch", 4))
    torch.manual_seed(3)
    weight, bias = torch.randn(96, 64) * 0.1, torch.randn(96)
    layer = PackedLinear(weight, bias, "gelu_tanh")
    assert layer.kernel == "onednn" and layer._dense.data_ptr() == weight.data_ptr()  # a view, no second copy
    for rows in (1, 4, 9):
        x = torch.randn(rows, 64)
        plain = F.gelu(F.linear(x, weight, bias), approximate="tanh")
        if rows <= 4:
            assert torch.equal(layer(x), plain)  # F.linear itself
        else:
            assert torch.allclose(layer(x), plain, atol=1e-5)  # oneDNN's packed kernel
    assert PackedLinear(weight, bias, cpu_linear="onednn")._dense is None  # nothing kept where it is not read


def test_the_lm_head_keeps_no_second_dense_copy(monkeypatch):
    from roseinfer.config import ModelConfig
    from roseinfer.models.gpt2 import GPT2

    monkeypatch.setattr(packed_linear, "fp32_small_rows", lambda: ("torch", 4))
    model = GPT2(ModelConfig(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)).eval()
    model.pack_for_cpu()
    head = model.__dict__["_packed_lm_head"]
    assert head._dense.data_ptr() == model.wte.weight.data_ptr()
    hidden = torch.randn(2, 32)
    assert torch.equal(model.compute_logits(hidden), F.linear(hidden, model.wte.weight))


@needs_f32_kernel
def test_a_projection_on_roseinfers_kernel_refuses_rows_of_another_width(monkeypatch):
    monkeypatch.setattr(packed_linear, "fp32_small_rows", lambda: ("roseinfer", 4))
    layer = PackedLinear(torch.randn(40, 16), None)
    with pytest.raises(ValueError, match="x has 17 columns, the weight 16"):
        layer(torch.randn(2, 17))  # the kernel would read past each row of x
    assert layer(torch.randn(2, 2, 16)).shape == (2, 2, 40)  # leading dimensions kept
