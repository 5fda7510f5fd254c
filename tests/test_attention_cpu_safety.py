"""The CPU attention kernel on inputs it must not trust: bad block tables, layouts it cannot read,
an empty step, a thread count changed after the backend was built."""

from __future__ import annotations

import logging

import pytest
import torch
from test_attention import CASES, build_case, contiguous_reference

from roseinfer.attention import cpu as cpu_attention
from roseinfer.attention.base import AttentionMetadata
from roseinfer.attention.cpu import CpuPagedAttention

pytestmark = pytest.mark.skipif(not CpuPagedAttention().fused, reason="no C compiler: the kernel cannot be built here")


def test_a_context_longer_than_its_block_table_row_is_an_error_naming_the_sequence():
    q, k, v, k_cache, v_cache, meta, _ = build_case([(20, 1), (40, 1), (9, 1)], 16)  # rows of 3 blocks
    meta.context_lens[1] = 3 * 16 + 1  # one token past its row: the next row's first block would be read
    meta.max_context_len = 49
    with pytest.raises(IndexError, match="sequence 1 of the step: its context of 49 tokens needs 4 blocks"):
        CpuPagedAttention().forward(q, k, v, k_cache, v_cache, meta, 0.25)


@pytest.mark.parametrize("bad", ["num_blocks", -1])
@pytest.mark.parametrize("case", ["decode", "mixed"])
def test_a_block_id_outside_the_cache_is_an_error_naming_the_sequence(bad, case):
    q, k, v, k_cache, v_cache, meta, _ = build_case(CASES[case], 16)
    block = k_cache.shape[0] if bad == "num_blocks" else bad
    meta.block_tables[2, 0] = block
    with pytest.raises(IndexError, match=f"sequence 2 of the step: block id {block} "):
        CpuPagedAttention().forward(q, k, v, k_cache, v_cache, meta, 0.25)


class RecordingKernel:
    """The kernel library, recording the thread count each attention call is given."""

    def __init__(self, lib):
        self.lib, self.threads = lib, []

    def __getattr__(self, name):
        fn = getattr(self.lib, name)
        if name not in cpu_attention.KERNELS.values():
            return fn

        def call(*args):
            self.threads.append(args[14])  # q, k, v, slots, stride, slots, caches, tables, lens, out, seqs, parts, group
            return fn(*args)

        return call


def test_the_thread_count_is_read_at_every_call(monkeypatch):
    monkeypatch.setattr(cpu_attention, "SPLIT_ABOVE_ROW_TOKENS", 0)  # split whenever there are threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        backend = CpuPagedAttention()
        backend.kernel = RecordingKernel(backend.kernel)
        torch.set_num_threads(1)  # after the backend was built
        q, k, v, k_cache, v_cache, meta, seqs = build_case([(300, 1)] * 3, 16)
        out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
    finally:
        torch.set_num_threads(before)
    assert backend.kernel.threads == [1]
    assert (out.double() - contiguous_reference(*seqs, 0.25)).abs().max() <= 1e-5


def test_a_transposed_value_cache_takes_the_torch_path_and_says_so_once(caplog):
    q, k, v, k_cache, v_cache, meta, seqs = build_case(CASES["decode"], 4)
    v_cache = v_cache.transpose(2, 3).contiguous().transpose(2, 3)  # the same values, head_dim strided
    assert not v_cache.is_contiguous() and k_cache.is_contiguous()
    backend = CpuPagedAttention()
    with caplog.at_level(logging.WARNING, logger="roseinfer.attention"):
        for _ in range(2):
            meta.backend_state.clear()
            out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
            assert (out.double() - contiguous_reference(*seqs, 0.25)).abs().max() <= 1e-5
    assert caplog.text.count("not contiguous") == 1  # loud, but once


def test_a_bf16_cache_under_an_fp32_query_is_refused_not_read_as_fp32():
    q, k, v, k_cache, v_cache, meta, _ = build_case(CASES["decode"], 4)
    with pytest.raises(RuntimeError, match="dtype"):  # the torch path's own refusal, not garbage
        CpuPagedAttention().forward(q, k, v, k_cache.bfloat16(), v_cache.bfloat16(), meta, 0.25)


def test_the_refusal_names_each_unreadable_layout():
    q, k, v, k_cache, v_cache, _, _ = build_case(CASES["decode"], 4)
    check = lambda *t: cpu_attention.kernel_refusal(*t, 256, 4096)  # noqa: E731
    assert check(q, k, v, k_cache, v_cache) is None
    assert "dtypes" in check(q, k, v, k_cache.bfloat16(), v_cache.bfloat16())
    assert "cache shapes" in check(q, k, v, k_cache, v_cache[:, :2])
    assert "query, key and value" in check(q, k[:, :2], v, k_cache, v_cache)
    assert "over the kernel's limits" in cpu_attention.kernel_refusal(q, k, v, k_cache, v_cache, 2, 4096)


def test_an_empty_step_returns_an_empty_output():
    heads, head_dim = 4, 16
    k_cache = torch.zeros(3, 4, heads, head_dim)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.int64),
        block_tables=torch.zeros(0, 1, dtype=torch.int32),
        context_lens=torch.zeros(0, dtype=torch.int32),
        query_start_loc=torch.zeros(1, dtype=torch.int32),
        max_query_len=1,
        max_context_len=0,
    )
    q = torch.zeros(0, heads, head_dim)
    out = CpuPagedAttention(num_threads=2).forward(q, q, q, k_cache, k_cache.clone(), meta, 0.25)
    assert out.shape == (0, heads, head_dim)
    assert cpu_attention.plan_pieces(0, heads, head_dim, 2, 4096, 64) == (2, 4)
