"""The bf16 kernel's arithmetic, written out in torch: tested on any CPU, and the kernel held to it where it runs.

linear_bf16.c reads the weight in panels of 32 output columns ([N/32][K/2][32][2]), multiplies
bf16 pairs into fp32 accumulators (a product of two bf16 values is exact in fp32), adds the fp32
bias, applies GELU, and rounds to bf16 (nearest, ties to even). argmax_bf16 compares bf16 values
through 16-bit order keys. `emulate_linear` and `order_keys` below do the same steps in torch,
reading the same packed layout, so the layout and the arithmetic are checked on every x86 (the
kernel itself needs AVX512-BF16; where the CPU lacks it, only its comparison is skipped).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from roseinfer.kernels.cpu.bindings import (
    PANEL_COLUMNS,
    argmax_bf16,
    bf16_linear,
    load_bf16_linear_kernel,
    pack_panels,
    unpack_panels,
)

kernel_runs = pytest.mark.skipif(
    load_bf16_linear_kernel() is None,
    reason="the kernel needs AVX512-BF16 (and a C compiler); its arithmetic is still tested above, in torch",
)


def emulate_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, gelu: bool, n: int):
    """linear_bf16.c's arithmetic, reading its packed layout: fp32 sums of exact bf16 products, pair by pair."""
    panels, pairs, columns, _ = packed.shape
    xf, wf = x.float(), packed.float()  # bf16 -> fp32 is exact
    acc = torch.zeros(x.shape[0], panels, columns)
    for p in range(pairs):
        for j in (0, 1):  # the two k of a pair, as vdpbf16ps adds them
            acc = acc + xf[:, None, None, 2 * p + j] * wf[None, :, p, :, j]
    y = acc.reshape(x.shape[0], panels * columns)
    if bias is not None:
        y = y + bias[None, :]
    if gelu:
        y = F.gelu(y, approximate="tanh")
    return y[:, :n].bfloat16()  # torch rounds fp32 to bf16 to nearest, ties to even, as vcvtneps2bf16


def order_keys(values: torch.Tensor) -> torch.Tensor:
    """argmax_bf16's 16-bit keys: ordered as the bf16 values, any NaN on top."""
    bits = values.bfloat16().view(torch.int16).to(torch.int32) & 0xFFFF
    keys = torch.where(bits & 0x8000 != 0, bits ^ 0xFFFF, bits | 0x8000)
    return torch.where(bits & 0x7FFF > 0x7F80, 0xFFFF, keys)


def padded_bias(bias: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(packed.shape[0] * PANEL_COLUMNS)
    out[: bias.shape[0]] = bias.float()
    return out


def case(rows: int, n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    weight = (torch.randn(n, k, generator=gen) * 0.1).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    return x, weight, bias


def test_the_panel_layout_puts_a_pair_of_k_for_32_columns_side_by_side():
    weight = torch.arange(40 * 8).view(40, 8).bfloat16()
    packed = pack_panels(weight)
    assert packed.shape == (2, 4, PANEL_COLUMNS, 2)  # 40 columns: two panels, the second zero-padded
    for panel, pair, column, j in ((0, 0, 0, 0), (0, 3, 31, 1), (1, 2, 7, 0)):
        assert packed[panel, pair, column, j] == weight[panel * PANEL_COLUMNS + column, 2 * pair + j]
    assert not packed[1, :, 8:].any()  # columns 40..63 do not exist: zeros, never read into y
    flat = packed.flatten()  # the order the kernel streams: one panel, pair after pair, 64 values each
    assert torch.equal(flat[:PANEL_COLUMNS * 2].view(PANEL_COLUMNS, 2), weight[:PANEL_COLUMNS, :2])
    assert torch.equal(unpack_panels(packed, 40), weight)


@pytest.mark.parametrize("gelu", [False, True])
def test_the_emulated_arithmetic_is_a_linear_layer_within_bf16_rounding(gelu):
    x, weight, bias = case(13, 70, 64, seed=1)
    packed = pack_panels(weight)
    y = emulate_linear(x, packed, padded_bias(bias, packed), gelu, 70)
    exact = F.linear(x.double(), weight.double(), bias.double())
    if gelu:
        exact = F.gelu(exact, approximate="tanh")
    assert ((y.double() - exact).abs() <= 2**-8 * exact.abs() + 1e-5).all()  # one bf16 rounding


def test_the_order_keys_sort_bf16_values_and_put_nan_on_top():
    values = torch.tensor([-float("inf"), -3.0, -0.0, 0.0, 1e-3, 2.5, float("inf")]).bfloat16()
    keys = order_keys(values)
    assert (keys[1:] >= keys[:-1]).all() and keys[2] < keys[3]  # -0 sorts below +0 (as floats they tie)
    assert order_keys(torch.tensor([float("nan"), -float("nan")])).tolist() == [0xFFFF, 0xFFFF]
    row = torch.randn(4, 301).bfloat16()
    assert torch.equal(order_keys(row).argmax(dim=-1), row.float().argmax(dim=-1))


@kernel_runs
@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("rows, n, k", [(1, 32, 64), (13, 70, 256), (50, 97, 128)])
def test_the_kernel_computes_its_own_arithmetic(rows, n, k, gelu):
    x, weight, bias = case(rows, n, k, seed=rows + n)
    packed = pack_panels(weight)
    fp32_bias = padded_bias(bias, packed)
    y = bf16_linear(x, packed, fp32_bias, gelu, n)
    expected = emulate_linear(x, packed, fp32_bias, gelu, n)
    same = y == expected
    # Sums in the same order give the same fp32 value; only GELU's own exp (a polynomial in the
    # kernel) can move an output across a bf16 rounding boundary: one bf16 step at most, seldom.
    assert same.float().mean() >= (0.98 if gelu else 1.0)
    assert ((y.float() - expected.float()).abs() <= 2**-7 * expected.float().abs() + 1e-6).all()


@kernel_runs
def test_the_kernel_argmax_is_the_argmax_of_the_order_keys():
    logits = (torch.randn(6, 1000) * 4).bfloat16()
    logits[2, 10] = logits[2, 500] = 100.0  # a tie: the first index
    logits[4] = -2.0  # all equal negatives
    assert torch.equal(argmax_bf16(logits), order_keys(logits).argmax(dim=-1))
