"""roseinfer/bench/one_launch.py: notebook 09's counts, checks, timings and figures."""

from __future__ import annotations

import pytest

from roseinfer import InferenceEngine
from roseinfer.bench import one_launch
from roseinfer.kernels.cpu.bindings import load_decode_layers_kernel
from roseinfer.models import fused_decode, packed_linear

needs_c = pytest.mark.skipif(load_decode_layers_kernel() is None, reason="no C compiler for the CPU kernels")


@pytest.fixture(scope="module", params=["gpt2-tiny", "llama-tiny"])
def engine(request):
    with pytest.MonkeyPatch.context() as patch:  # roseinfer's fp32 kernel for a few rows, whatever this CPU's probe
        patch.setattr(packed_linear, "fp32_small_rows", lambda: ("roseinfer", 4))
        patch.setattr(packed_linear, "fp32_fused_rows", lambda: 4)
        return InferenceEngine.from_pretrained(request.param, dtype="float32", num_kv_blocks=64)


def test_one_call_sets_and_restores_the_switch():
    assert fused_decode.enabled
    with one_launch.one_call(False):
        assert not fused_decode.enabled
        with pytest.raises(RuntimeError), one_launch.one_call(True):
            assert fused_decode.enabled
            raise RuntimeError
        assert not fused_decode.enabled
    assert fused_decode.enabled


@needs_c
def test_the_one_call_dispatches_less_and_gives_the_same_answer(engine):
    free = engine.block_manager.num_free_blocks
    assert one_launch.one_call_rows(engine) == 4
    counts = {}
    for side in one_launch.SIDES:
        with one_launch.one_call(side == "one_call"):
            counts[side] = one_launch.count_step(engine)
    assert all(c["operators"] == c["views"] + c["computing"] for c in counts.values())
    assert all(counts["loop"][k] > counts["one_call"][k] for k in ("operators", "computing", "python_calls"))
    same = one_launch.same_answer(engine, ["Hello there", "a b c"], new_tokens=4)
    assert same["tokens_equal"] and same["taken"] == same["decode_steps"] == 6
    if engine.model_config.family == "llama":  # the same kernels in the same order: bit for bit
        assert same["bitwise"] and same["max_abs_diff"] == 0
    else:  # GPT-2's loop keeps torch's LayerNorm
        assert same["max_abs_diff"] < 1e-4
    assert engine.block_manager.num_free_blocks == free and fused_decode.enabled
    assert "run" not in one_launch._fused(engine).__dict__  # the counting wrapper is gone


def test_an_engine_without_the_one_call_says_so():
    engine = InferenceEngine.from_pretrained("gpt2-tiny", dtype="float32", num_kv_blocks=64, cpu_linear="onednn")
    assert one_launch.one_call_rows(engine) == 0
    same = one_launch.same_answer(engine, ["Hello"], new_tokens=3)
    assert same["tokens_equal"] and same["taken"] == 0 and same["bitwise"]


def test_time_sides_interleaves_and_divides_by_each_rounds_floor(engine):
    bandwidths = iter([1e9, 2e9, 4e9])
    free = engine.block_manager.num_free_blocks
    twin = one_launch.narrow_twin(engine, width=32)
    t = one_launch.time_sides(engine, batch=2, context=8, rounds=3, steps=2, meter=lambda: next(bandwidths), twin=twin)
    assert [len(t[k]) for k in ("loop_ms", "one_call_ms", "floor_ms")] == [3, 3, 3]
    assert t["floor_ms"][0] == pytest.approx(2 * t["floor_ms"][1]) == pytest.approx(4 * t["floor_ms"][2])
    assert t["loop_x_floor"][1] == pytest.approx(t["loop_ms"][1] / t["floor_ms"][1])
    assert t["step_mb"] > 0 and t["batch"] == 2
    assert [len(t["twin"][k]) for k in ("loop_ms", "one_call_ms")] == [3, 3] and t["twin"]["n_embd"] == 32
    assert engine.block_manager.num_free_blocks == free and twin.block_manager.num_free_blocks == 64
    alone = one_launch.time_sides(engine, batch=1, context=8, rounds=1, steps=1)
    assert "twin" not in alone and alone["floor_ms"] == [] and len(alone["loop_ms"]) == 1


def test_narrow_twin_keeps_the_family_depth_and_grouping(engine):
    twin = one_launch.narrow_twin(engine, width=32)
    config, narrow = engine.model_config, twin.model_config
    assert (narrow.family, narrow.n_layer, narrow.n_embd, narrow.head_dim) == (config.family, config.n_layer, 32, 16)
    assert narrow.n_head // narrow.n_kv_head == config.n_head // config.n_kv_head
    assert twin.runner.dtype == engine.runner.dtype


def test_gpu_eager_vs_graphs_alternates_and_restores_the_graphs(monkeypatch):
    from contextlib import contextmanager

    seen = []

    @contextmanager
    def batch_of(engine, batch, context):
        yield batch

    def times(engine, step, repeats):
        seen.append((engine.runner.graphs, step))
        return [1.0 if engine.runner.graphs is None else 0.25] * repeats

    monkeypatch.setattr(one_launch, "decode_batch", batch_of)
    monkeypatch.setattr(one_launch, "step_times_ms", times)
    graphs = object()
    engine = type("Engine", (), {"runner": type("Runner", (), {"graphs": graphs})()})()
    rows, runs = one_launch.gpu_eager_vs_graphs(engine, [1, 8], context=16, rounds=2, repeats=3)
    assert engine.runner.graphs is graphs
    assert seen == [(None, 1), (graphs, 1)] * 2 + [(None, 8), (graphs, 8)] * 2
    assert runs[("triton_eager", 8)] == [1.0, 1.0] and runs[("triton_graphs", 1)] == [0.25, 0.25]
    by_batch = one_launch.graph_rows(rows)
    assert list(by_batch) == [1, 8] and by_batch[8]["triton_graphs"] == [0.25, 0.25]


def test_graph_rows_keeps_one_context_and_complete_batches():
    rows = [{"variant": v, "batch": b, "context": c, "step_ms": ms}
            for v, b, c, ms in [("triton_eager", 4, 128, 2.0), ("triton_graphs", 4, 128, 1.0),
                                ("triton_eager", 1, 128, 3.0), ("triton_eager", 1, 512, 9.0),
                                ("triton_graphs", 1, 512, 1.5)]]
    assert one_launch.graph_rows(rows) == {4: {"triton_eager": [2.0], "triton_graphs": [1.0]}}
    assert one_launch.graph_rows(rows, context=512) == {1: {"triton_eager": [9.0], "triton_graphs": [1.5]}}


def test_printed_sources_are_found():
    loop = one_launch.c_loop_source()
    assert loop.splitlines()[1].startswith("for (int64_t l = 0;") and loop.rstrip().endswith("}")
    assert "attention(" in loop and loop.count("linear(") == 4
    condition = one_launch.condition_source()
    assert "is_decode_only" in condition and condition.rstrip().endswith("return False")
    assert condition.splitlines()[1].startswith("if not (enabled")


def test_plots_draw():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timing = {"loop_ms": [13.0, 13.4], "one_call_ms": [11.7, 11.9], "loop_x_floor": [1.27, 1.3],
              "one_call_x_floor": [1.11, 1.12]}
    rows = [{"variant": v, "batch": b, "context": 256, "step_ms": 1.0, "step_ms_runs": [1.0, 1.1]}
            for v in ("triton_eager", "triton_graphs") for b in (1, 8)]
    for fig in (one_launch.plot_cpu({"gpt2": timing, "smollm2-135m": timing}, "batch 1"),
                one_launch.plot_gpu(rows, "H200")):
        try:
            assert len(fig.axes) == 1
        finally:
            plt.close(fig)
