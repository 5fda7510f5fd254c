"""Notebook 08's measuring code (roseinfer.bench.paged_attention): the case it builds, the gather it times, the
accounts it prints and the figure it draws."""

from __future__ import annotations

import math

import pytest
import torch

from roseinfer.bench import paged_attention as pa


def naive_attention(q, k_cache, v_cache, meta, scale):
    """Each sequence alone: its tokens looked up one by one through the table, a plain softmax."""
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    for b, n in enumerate(meta.context_lens.tolist()):
        slots = [(int(meta.block_tables[b, t // block_size]), t % block_size) for t in range(n)]
        k = torch.stack([k_cache[blk, s] for blk, s in slots])  # [n, H, D]
        v = torch.stack([v_cache[blk, s] for blk, s in slots])
        weights = torch.softmax(torch.einsum("hd,nhd->hn", q[b], k) * scale, dim=1)
        out[b] = torch.einsum("hn,nhd->hd", weights, v)
    return out


def test_decode_case_equal_contexts_by_default_and_poison_where_no_sequence_reads():
    q, k_cache, v_cache, meta = pa.decode_case(3, 21, heads=2, head_dim=4, block_size=8, seed=5)
    assert q.shape == (3, 2, 4) and k_cache.shape == v_cache.shape == (3 * 3 + 1, 8, 2, 4)
    assert meta.context_lens.tolist() == [21, 21, 21] and meta.max_context_len == 21
    assert len(set(meta.block_tables.flatten().tolist())) == 9  # every sequence its own blocks
    owned = torch.zeros(10, 8, dtype=torch.bool)
    for b in range(3):
        for t in range(21):
            owned[meta.block_tables[b, t // 8], t % 8] = True
    assert (k_cache[~owned] == pa.POISON).all() and (v_cache[~owned] == pa.POISON).all()
    assert (k_cache[owned].abs() < 100).all()
    again = pa.decode_case(3, 21, heads=2, head_dim=4, block_size=8, seed=5)
    assert torch.equal(again[1], k_cache) and torch.equal(again[3].block_tables, meta.block_tables)  # seeded


def test_gather_attention_equals_each_sequence_alone_ragged_too_and_into_reused_buffers():
    reused = pa.ReusedGather()
    for batch, lens in ((2, [3, 1]), (3, None), (3, [19, 7, 1]), (2, [3, 1])):  # the buffers grow, then serve less
        q, k_cache, v_cache, meta = pa.decode_case(batch, 19, heads=2, head_dim=4, block_size=4, seed=2, lens=lens)
        expected = naive_attention(q, k_cache, v_cache, meta, 0.5)
        torch.testing.assert_close(pa.gather_attention(q, k_cache, v_cache, meta, 0.5), expected)
        torch.testing.assert_close(reused(q, k_cache, v_cache, meta, 0.5), expected)
    assert reused.buffers[0].numel() == 3 * 19 * 2 * 4  # kept from the largest call


def test_the_c_kernel_reads_the_same_case_as_the_gather():
    from roseinfer.attention.cpu import CpuPagedAttention

    fused = CpuPagedAttention()
    if not fused.fused:
        pytest.skip("no C compiler: the CPU backend runs the gather")
    q, k_cache, v_cache, meta = pa.decode_case(4, 37, heads=4, head_dim=16, seed=1, lens=[37, 30, 16, 1])
    torch.testing.assert_close(fused.decode(q, k_cache, v_cache, meta, 0.25),
                               pa.gather_attention(q, k_cache, v_cache, meta, 0.25))


def test_measure_interleaves_and_sizes_the_copy():
    order = []
    variants = {key: (lambda *case, key=key: order.append(key)) for key in ("before", "reused", "after")}
    rows = pa.measure(variants, [1, 2], [5, 20], repeats=3, heads=2, head_dim=4, warmup=1)
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 5), (1, 20), (2, 5), (2, 20)]
    assert order[:12] == ["before", "reused", "after"] * 4  # one warm-up round, then strictly interleaved
    for r in rows:
        assert all(len(r[f"{key}_{what}"]) == 3 for key in variants for what in ("ms", "faults"))
        assert r["gather_mb"] == r["kv_mb"] == r["batch"] * r["context"] * 2 * 2 * 4 * 4 / 2**20  # nothing padded
        assert r["speedup"] > 0


def test_fault_accounts():
    row = {"batch": 32, "context": 1000, "gather_mb": 187.5, "before_ms": [90.0, 100.0, 110.0],
           "before_faults": [48000, 48000, 48000], "reused_ms": [30.0, 25.0, 40.0], "after_ms": [7.0, 8.0, 9.0]}
    assert pa.fresh_share(row) == pytest.approx(0.7)
    assert pa.fresh_share(dict(row, reused_ms=[120.0])) == 0  # reusing saved nothing
    assert pa.fault_share(row, 0.5) == pytest.approx(0.24)
    assert pa.on_the_cliff(row) and pa.past_malloc_ceiling(row)
    calm = dict(row, gather_mb=46.9, before_faults=[0, 12, 0])
    assert not pa.on_the_cliff(calm) and not pa.past_malloc_ceiling(calm) and pa.fault_share(calm, 0.5) == 0
    assert pa.read_gib_s(1024, 1000) == 1.0 and pa.name(row) == "32 x 1000" and pa.size(row) == 32000
    costs = pa.fault_cost_us(runs=2)  # 64 MiB: past the mmap ceiling, so fresh pages every time
    assert len(costs) == 2 and all(math.isfinite(c) for c in costs)  # a timing: its size is the notebook's to judge


def test_gpu_lines_say_the_padding_the_rate_and_the_programs():
    rows = [{"batch": 1, "context": 128, "gather_mb": 0.75, "kv_mb": 0.75, "before_ms": [0.16], "after_ms": [0.08]},
            {"batch": 128, "context": 1000, "gather_mb": 750.0, "kv_mb": 416.6, "before_ms": [1.36],
             "after_ms": [0.35]}]
    first, last, drawn = pa.gpu_lines(rows, 12, "h200", "ragged", peak_gib_s=3841.0)
    assert "1 x 128" in first and "(the gather copied" not in first and "12 programs" in first
    assert "(the gather copied 750)" in last and "1536 programs" in last and "of its measured 3841" in last
    assert drawn == "h200: contexts ragged"
    assert pa.committed_read_gib_s("no-such-gpu") is None


def test_show_lines_prints_the_slice(capsys):
    pa.show_lines(naive_attention, "for b, n in", "out[b] =")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].strip().startswith("for b, n in") and printed[-1].strip().startswith("out[b] =")


def test_plot_cases_draws_both_panels():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nothing = {key: (lambda *case: None) for key in ("before", "reused", "after")}
    rows = pa.measure(nothing, [1, 2], [5], repeats=2, heads=2, head_dim=4, warmup=0)
    for r in rows:  # times that make a speed-up, and one case on the cliff
        r["before_ms"], r["reused_ms"], r["after_ms"] = [2.0, 2.2], [1.5, 1.6], [1.0, 1.1]
        r["speedup"] = 2.0
    rows[-1]["before_faults"] = [10**6, 10**6]
    fig = pa.plot_cases(rows, ("gather", "kernel"), "test")
    try:
        assert len(fig.axes) == 2
        assert any("of\nthe gather" in t.get_text() for t in fig.axes[1].texts)
    finally:
        plt.close(fig)
