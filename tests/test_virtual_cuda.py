"""The virtual-CUDA mode itself: it reports CUDA, runs on the CPU, and fails where a GPU run would.

Each failure case here is a bug a CUDA user would hit (items 1 and 2 of issue 13
among them), reproduced in a few lines; the engine, benchmark and notebook
suites (test_virtual_cuda_engine.py, test_virtual_cuda_notebooks.py) then run
every CUDA branch under the same mode.
"""

from __future__ import annotations

import threading

import pytest
import torch

from roseinfer.kernels.triton import triton_available
from roseinfer.testing.virtual_cuda import DeviceMixError, active, is_cuda, stats


def test_cuda_tensors_are_tagged_cpu_tensors(virtual_cuda):
    x = torch.ones(4, device="cuda")
    assert x.device == torch.device("cuda", 0) and x.is_cuda and is_cuda(x)
    y = (x * 2).sum(0)
    assert y.device.type == "cuda" and y.item() == 8.0
    host = torch.arange(3)
    moved = host.to("cuda", non_blocking=True)
    assert is_cuda(moved) and not is_cuda(host) and moved is not host
    back = moved.cpu()
    assert back.device.type == "cpu" and not is_cuda(back) and torch.equal(back, host)
    model = torch.nn.Linear(3, 2).to(device="cuda", dtype=torch.float32)
    assert next(model.parameters()).device.type == "cuda"
    assert model(torch.ones(1, 3, device="cuda")).device.type == "cuda"
    assert x.new_zeros(2).is_cuda and torch.empty_like(x).is_cuda and not torch.zeros(2).is_cuda
    assert torch.cuda.is_available() and torch.cuda.get_device_name().startswith("virtual CUDA")
    with pytest.raises(DeviceMixError, match="numpy"):
        x.numpy()


def test_mixing_a_cuda_tensor_with_a_host_tensor_fails_with_the_line(virtual_cuda):
    x = torch.ones(3, device="cuda")
    assert (x + torch.tensor(2.0)).is_cuda  # a 0-dim host tensor is a scalar: allowed on a GPU too
    with pytest.raises(DeviceMixError, match=r"add mixes devices .*test_virtual_cuda.py:\d+"):
        x + torch.ones(3)
    with pytest.raises(DeviceMixError, match="index_select"):
        x.index_select(0, torch.tensor([0, 2]))
    with pytest.raises(DeviceMixError, match="cat"):
        torch.cat([x, torch.ones(3)])


def test_generators_remember_their_device(virtual_cuda):
    cuda_gen = torch.Generator(device="cuda").manual_seed(0)
    assert cuda_gen.device.type == "cuda"
    torch.empty(4, device="cuda").exponential_(generator=cuda_gen)
    with pytest.raises(DeviceMixError, match="generator made for cpu"):
        torch.empty(4, device="cuda").exponential_(generator=torch.Generator().manual_seed(0))
    with pytest.raises(DeviceMixError, match="generator made for cuda"):
        torch.randn(4, generator=cuda_gen)


def test_seeding_works_and_repeats(virtual_cuda):
    """torch.manual_seed calls torch.cuda.manual_seed_all: the stub must seed, not call back into it."""
    draws = []
    for seed in (torch.manual_seed, torch.cuda.manual_seed, torch.cuda.manual_seed_all):
        seed(7)
        draws.append(torch.randn(3, device="cuda"))
    assert all(torch.equal(draws[0], d) for d in draws)


def test_asynchronous_copies_must_be_contiguous(virtual_cuda):
    host = torch.zeros((4, 8), dtype=torch.int64, pin_memory=True)
    assert host.is_pinned()
    dev = torch.zeros((4, 8), dtype=torch.int64, device="cuda")
    before = stats().h2d_copies
    dev.copy_(host, non_blocking=True)
    dev[1].copy_(host[1], non_blocking=True)  # a row: contiguous
    assert stats().h2d_copies == before + 2
    with pytest.raises(DeviceMixError, match="non-contiguous source"):
        dev[:, :4].copy_(host[:, :4], non_blocking=True)


def test_graph_capture_is_refused_not_faked(virtual_cuda):
    with pytest.raises(NotImplementedError, match="capture=False"):
        torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.ones(1, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    end.record()
    torch.cuda.synchronize()
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)


def test_threads_started_under_the_mode_run_under_it(virtual_cuda):
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.zeros(1, device="cuda").device.type))
    t.start()
    t.join()
    assert seen == ["cuda"]


def test_leaving_the_mode_restores_torch():
    from roseinfer.testing.virtual_cuda import virtual_cuda

    with virtual_cuda():
        assert active()
    assert not active() and torch.Generator is torch._C.Generator
    assert torch.cuda.is_available() is False or torch.cuda.get_device_name() != "virtual CUDA (CPU tensors)"


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_a_triton_kernel_given_host_tensors_fails(virtual_cuda):
    """Issue 13, item 1: notebook 08 built the kernel's inputs on the host."""
    from roseinfer.kernels.triton.paged_attention import write_kv

    key = torch.ones(2, 1, 4, device="cuda")
    cache = torch.zeros(3, 2, 1, 4, device="cuda")
    write_kv(key, key, cache, cache.clone(), torch.tensor([0, 3], device="cuda"))
    assert cache.view(-1, 4)[3].sum().item() == 4
    with pytest.raises(DeviceMixError, match="Triton kernel got a host tensor"):
        write_kv(key, key, cache, cache.clone(), torch.tensor([0, 3]))


def test_half_moved_attention_metadata_fails(virtual_cuda):
    """Issue 13, item 2: notebook 08 moved some metadata tensors to the GPU and not others."""
    from test_attention import build_case

    from roseinfer.attention.torch_ref import TorchPagedAttention

    meta = build_case([(9, 1), (20, 1)], 4, 2, 8, seed=0)[5]
    meta.block_tables, meta.context_lens = meta.block_tables.cuda(), meta.context_lens.cuda()
    with pytest.raises(DeviceMixError, match=r"roseinfer/attention/torch_ref.py:\d+ in plan"):
        TorchPagedAttention().plan(meta, 4, 2)


def test_nesting_keeps_one_mode_per_thread(virtual_cuda):
    from roseinfer.testing.virtual_cuda import virtual_cuda as again

    with again():
        x = torch.arange(4).to("cuda", copy=True)
        assert x.is_cuda and torch.equal(x.cpu(), torch.arange(4))
    assert active() and torch.ones(1, device="cuda").is_cuda


def test_in_place_ops_return_their_tensor_and_moves_return_new_ones(virtual_cuda):
    x = torch.zeros(3, device="cuda")
    assert x.add_(1) is x and x.is_cuda
    host = torch.ones(3)
    moved = torch.as_tensor(host, device="cuda")  # on the CPU this would be `host` itself
    assert moved is not host and moved.is_cuda and not host.is_cuda
