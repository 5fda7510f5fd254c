"""The Llama block's RMSNorm, RoPE and silu(gate) * up and GPT-2's LayerNorm: roseinfer's C kernel (pointwise.c)
against the torch reference it replaces, in fp32 and bf16, on this CPU's build and (on x86-64) the AVX2 class's and
a portable one."""

import pytest
import torch
import torch.nn.functional as F
from kernel_classes import build_classes

from roseinfer.kernels.cpu.bindings import POINTWISE_SOURCE, bind_pointwise, load_pointwise_kernel
from roseinfer.kernels.cpu.build import load_kernel_library
from roseinfer.models import pointwise

pytestmark = pytest.mark.skipif(load_pointwise_kernel() is None, reason="no C compiler: the reference runs")
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", params=build_classes(), ids=lambda c: c[0])
def kernel(request):
    """Route the wrappers to this class's build of the kernel (the native one is what the engine loads)."""
    if request.param[1] is None:
        lib = load_pointwise_kernel()
    else:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ROSEINFER_KERNEL_MARCH", request.param[1])
            lib = load_kernel_library(POINTWISE_SOURCE, "pointwise", "none")
        if lib is None:
            pytest.skip(f"the {request.param[0]} class's kernel does not build here")
        lib = bind_pointwise(lib)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pointwise, "load_pointwise_kernel", lambda: lib)
        yield lib


def within_rounding(got, want, dtype, atol=None):
    """fp32: a few ulps (a sum's order, the exp's polynomial); bf16: one bf16 rounding step at most. `atol`: where
    fp32 intermediates may differ by more than the output's ulps (LayerNorm's mean, near outputs of about 0)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol, default = (4e-6, 1e-7) if dtype == torch.float32 else (2 ** -7, 1e-30)
    atol = default if atol is None else atol
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, dim", [(1, 576), (3, 40), (70, 576), (0, 64)])  # a tail past the vectors; threads
def test_rms_norm_is_the_reference(kernel, dtype, rows, dim):
    gen = torch.Generator().manual_seed(rows * 7 + dim)
    x = (torch.randn(rows, dim, generator=gen) * 3).to(dtype)
    weight = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    within_rounding(pointwise.rms_norm(x, weight, 1e-6), pointwise.rms_norm_reference(x, weight, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, dim", [(1, 768), (3, 40), (40, 768), (0, 64)])
def test_layer_norm_is_the_reference(kernel, dtype, rows, dim):
    gen = torch.Generator().manual_seed(rows * 5 + dim)
    x = (torch.randn(rows, dim, generator=gen) * 3 + 20).to(dtype)  # a mean far from 0: no cancellation in the variance
    weight = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dtype)
    bias = (0.1 * torch.randn(dim, generator=gen)).to(dtype)
    got, want = pointwise.layer_norm(x, weight, bias, 1e-5), F.layer_norm(x, (dim,), weight, bias, 1e-5)
    within_rounding(got, want, dtype, atol=2e-6)  # the mean's last bit (about 20: 2e-6), times 1 / std (about 1/3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, heads, kv_heads, head_dim", [(1, 9, 3, 64), (5, 4, 4, 40), (2, 8, 2, 128), (0, 2, 1, 64)])
def test_rope_turns_q_and_k_in_place_bit_for_bit(kernel, dtype, rows, heads, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(heads * head_dim + rows)
    qkv = torch.randn(rows, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 500  # positions up to ~500
    cos = torch.cat((angles, angles), dim=-1)[:, None, :].cos().to(dtype)
    sin = angles.sin()
    signed_sin = torch.cat((-sin, sin), dim=-1)[:, None, :].to(dtype)
    got, want = qkv.clone(), qkv.clone()
    pointwise.rope_(got[:, : heads + kv_heads], cos, signed_sin)  # a strided view: v's heads sit after each row
    pointwise.rope_reference_(want[:, : heads + kv_heads], cos, signed_sin)
    assert torch.equal(got, want)  # the same products and sums, rounded where torch rounds them; v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, inter", [(1, 1536), (4, 37), (40, 1536), (0, 16)])
def test_silu_mul_is_the_reference(kernel, dtype, rows, inter):
    gen = torch.Generator().manual_seed(rows + inter)
    gate_up = (torch.randn(rows, 2 * inter, generator=gen) * 4).to(dtype)
    if rows:
        gate_up[0, :4] = torch.tensor([90.0, -90.0, 0.0, -0.0])  # exp's clamp, both signs of zero
    within_rounding(pointwise.silu_mul(gate_up), pointwise.silu_mul_reference(gate_up), dtype)


def test_what_the_kernel_cannot_read_takes_the_reference(monkeypatch):
    called = []
    monkeypatch.setattr(pointwise, "load_pointwise_kernel", lambda: called.append(1))
    x = torch.randn(4, 8)[:, ::2]  # not contiguous
    assert torch.equal(pointwise.rms_norm(x, torch.ones(4), 1e-6), pointwise.rms_norm_reference(x, torch.ones(4), 1e-6))
    wide = torch.randn(2, 3, 8).double()  # a dtype the kernel has no copy for
    assert torch.equal(pointwise.silu_mul(wide), pointwise.silu_mul_reference(wide))
    monkeypatch.setattr(pointwise, "use_kernel", False)
    y = torch.randn(2, 8)
    assert torch.equal(pointwise.rms_norm(y, torch.ones(8), 1e-6), pointwise.rms_norm_reference(y, torch.ones(8), 1e-6))
    assert called == []


def test_a_norm_weight_of_another_size_is_torchs_error_not_a_read_past_it(kernel):
    with pytest.raises(RuntimeError):
        pointwise.rms_norm(torch.randn(2, 8), torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError):
        pointwise.layer_norm(torch.randn(2, 8), torch.ones(4), torch.zeros(4), 1e-5)
    with pytest.raises(RuntimeError):
        pointwise.layer_norm(torch.randn(2, 8), torch.ones(8), torch.zeros(4), 1e-5)
