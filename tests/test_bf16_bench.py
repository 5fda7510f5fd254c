"""roseinfer.bench.bf16: notebook 11's analysis (agreement with fp32, step-time verdicts, roofline floors)."""

from __future__ import annotations

import pytest
import torch

from roseinfer.bench import bf16
from roseinfer.bench.roofline import decode_step_cost
from roseinfer.config import PRESETS
from roseinfer.kernels.cpu.bindings import BF16_KERNEL_SOURCE, load_bf16_linear_kernel


def test_variants_and_the_engines_bf16_path():
    assert list(bf16.variants(kernel=True)) == [bf16.FP32, bf16.ONEDNN, bf16.KERNEL]
    assert list(bf16.variants(kernel=False)) == [bf16.FP32, bf16.ONEDNN]
    assert bf16.ALL_VARIANTS[bf16.FP32] == ("float32", "auto")  # notebook 10's engine, not oneDNN forced
    assert bf16.engine_bf16(kernel=True, amx=False) == bf16.KERNEL
    assert bf16.engine_bf16(kernel=True, amx=True) == bf16.ONEDNN
    assert bf16.engine_bf16(kernel=False, amx=False) == bf16.ONEDNN


def test_kernel_inner_loop_is_the_k_pair_loop_without_continuations():
    loop = bf16.kernel_inner_loop(BF16_KERNEL_SOURCE.read_text()).splitlines()
    assert loop[0].startswith("for (int64_t p = 0; p < pairs") and loop[-1] == "}"
    assert sum("_mm512_dpbf16_ps" in line for line in loop) == 2
    assert not any(line.rstrip().endswith("\\") for line in loop)


@pytest.mark.skipif(load_bf16_linear_kernel() is None, reason="roseinfer's bf16 kernel needs AVX512-BF16")
def test_kernel_error_is_within_two_bf16_roundings():
    err = bf16.kernel_error(rows=(1, 13))
    assert set(err) == {"c_fc + GELU", "c_attn"}
    assert 0 < max(err.values()) <= 2**-7


def _logits(picks: list[int], margins: list[float], vocab: int = 8) -> torch.Tensor:
    """[len, vocab] logits whose argmax at row i is picks[i], ahead of the runner-up by margins[i]."""
    rows = torch.zeros(len(picks), vocab)
    for i, (pick, margin) in enumerate(zip(picks, margins)):
        rows[i, (pick + 1) % vocab] = 1.0
        rows[i, pick] = 1.0 + margin
    return rows


def test_agreement_finds_the_flip_at_a_near_tie():
    # one request of a 2-token prompt and 4 generated tokens: rows 1..4 predict them
    fp32_tokens, bf16_tokens = [[1, 2, 3, 4]], [[1, 2, 5, 6]]
    fp32 = _logits([0, 1, 2, 3, 4], [1.0, 1.0, 1.0, 0.01, 1.0])  # a near-tie at the third generated token
    flipped = _logits([0, 1, 2, 4, 4], [1.0, 1.0, 1.0, 0.01, 1.0])  # same history: only that pick differs
    result = bf16.agreement_from({bf16.FP32: fp32_tokens, bf16.ONEDNN: bf16_tokens},
                                 {bf16.FP32: [fp32], bf16.ONEDNN: [flipped]}, prompt_lens=[2], new_tokens=4)
    assert result.next_token[bf16.ONEDNN] == pytest.approx(0.75)
    assert result.prefix[bf16.ONEDNN] == pytest.approx(0.5)
    assert result.identical[bf16.ONEDNN] == 0
    assert result.split_margin[bf16.ONEDNN] == pytest.approx(0.01)
    assert result.typical_margin == pytest.approx(1.0)
    assert result.distinct == 4 and result.requests == 1
    assert 0 < result.logit_error[bf16.ONEDNN][0] < 1
    table = result.table()
    assert bf16.ONEDNN in table and "75.0%" in table and "0/1" in table


def test_agreement_without_a_split_has_no_margin():
    same = _logits([0, 1, 2, 3, 4], [1.0] * 5)
    result = bf16.agreement_from({bf16.FP32: [[1, 2, 3, 4]], bf16.KERNEL: [[1, 2, 3, 4]]},
                                 {bf16.FP32: [same], bf16.KERNEL: [same.clone()]}, [2], 4)
    assert result.split_margin[bf16.KERNEL] is None and result.identical[bf16.KERNEL] == 1
    assert "| -" in result.table().splitlines()[1].replace("  ", "")


RUNS = {  # ms: bf16 faster than fp32 everywhere; the kernel faster than oneDNN at 1, level at 32
    bf16.FP32: {1: [25.0, 26.0, 24.0, 25.5, 24.5], 32: [58.0, 59.0, 57.0, 58.5, 57.5]},
    bf16.ONEDNN: {1: [14.0, 15.0, 14.5, 14.2, 14.8], 32: [31.0, 25.0, 31.5, 24.0, 30.0]},
    bf16.KERNEL: {1: [7.0, 7.2, 7.1, 6.9, 7.3], 32: [25.0, 31.0, 24.5, 30.5, 25.5]},
}


def test_speed_table_verdicts_say_which_way_and_when_no_difference_shows():
    table, verdicts = bf16.speed_table(RUNS, bf16.KERNEL)
    to_bf16, kernel = verdicts["fp32 -> engine"], verdicts["oneDNN -> kernel"]
    assert all(v.better for v in to_bf16.values())
    assert to_bf16[1].ratio == pytest.approx(25.0 / 7.1)
    assert kernel[1].better and not kernel[32].significant
    lines = table.splitlines()
    assert "speed: kernel / oneDNN" in lines[0] and lines[1].startswith("1 ")
    assert "3.52x" in lines[1] and "same (p" in lines[2]
    without = {k: v for k, v in RUNS.items() if k != bf16.KERNEL}
    table, verdicts = bf16.speed_table(without, bf16.ONEDNN)
    assert "kernel / oneDNN" not in table and list(verdicts) == ["fp32 -> engine"]


def test_paired_ratio_is_robust_to_one_noisy_round():
    assert bf16.paired_ratio([10, 10, 10, 10, 100], [5, 5, 5, 5, 5]) == 2


def test_interleaved_runs_alternates_the_variants(monkeypatch):
    from contextlib import contextmanager

    from roseinfer.bench import decode_step

    order = []

    @contextmanager
    def fake_batch(engine, batch, context):
        yield (engine, batch)

    def fake_times(engine, step, repeats):
        order.append(step)
        return [float(step[1])] * repeats

    monkeypatch.setattr(decode_step, "decode_batch", fake_batch)
    monkeypatch.setattr(decode_step, "step_times_ms", fake_times)
    runs = bf16.interleaved_runs({"a": "A", "b": "B"}, [1, 4], context=8, rounds=2, repeats=3)
    assert runs == {"a": {1: [1.0, 1.0], 4: [4.0, 4.0]}, "b": {1: [1.0, 1.0], 4: [4.0, 4.0]}}
    assert order == [("A", 1), ("B", 1), ("A", 1), ("B", 1), ("A", 4), ("B", 4), ("A", 4), ("B", 4)]


PEAKS = {"float32": {"matmul_flops": 200e9, "mem_bytes_s": 50e9},
         "bfloat16": {"matmul_flops": 450e9, "mem_bytes_s": 60e9}}


def test_roofs_share_one_bandwidth_and_cap_the_kernel_at_twice_fp32():
    roof = bf16.roofs(PEAKS, {bf16.FP32: "float32", bf16.ONEDNN: "bfloat16", bf16.KERNEL: "bfloat16"})
    assert {r["mem_bytes_s"] for r in roof.values()} == {60e9}
    assert roof[bf16.ONEDNN]["matmul_flops"] == 450e9 and roof[bf16.KERNEL]["matmul_flops"] == 400e9


def test_floor_table_bytes_at_one_row_flops_at_many():
    gpt2 = PRESETS["gpt2"]
    table, rows = bf16.floor_table(gpt2, PEAKS, RUNS, context=64, engine=bf16.KERNEL, native=True)
    one, many = rows
    assert set(one.bound.values()) == {"bytes"} and set(many.bound.values()) == {"FLOPs"}
    assert one.floor_ms[bf16.FP32] / one.floor_ms[bf16.KERNEL] == pytest.approx(2.0)  # half the bytes
    cost = decode_step_cost(gpt2, [64], 4)
    assert one.floor_ms[bf16.FP32] == pytest.approx(cost.bytes / 60e9 * 1000)
    assert one.share[bf16.KERNEL] == pytest.approx(one.floor_ms[bf16.KERNEL] / 7.1)
    assert many.floor_ms[bf16.KERNEL] > many.floor_ms[bf16.ONEDNN]  # capped peak: a higher floor
    assert "2.00x" in table.splitlines()[2] and table.startswith("peaks: matmul fp32 200, bf16 450")


def test_floor_table_without_bf16_units_draws_only_fp32s_floor():
    table, rows = bf16.floor_table(PRESETS["gpt2"], PEAKS, {k: RUNS[k] for k in (bf16.FP32, bf16.ONEDNN)},
                                   context=64, engine=bf16.ONEDNN, native=False)
    assert all(set(r.floor_ms) == {bf16.FP32} for r in rows)
    assert ", -" in table.splitlines()[2]


def test_plot_steps_draws_time_and_speed_up():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = bf16.plot_steps(RUNS, "title")
    try:
        time_axis, speed_axis = fig.axes
        assert len(time_axis.get_lines()) == 3 and len(speed_axis.get_lines()) == 3  # two variants and the 1x line
    finally:
        plt.close(fig)
