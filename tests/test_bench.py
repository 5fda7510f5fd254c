"""Benchmark building blocks, and a smoke run of every benchmark script on a tiny model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from live_server import LiveServer
from roseinfer.bench.metrics import RequestRecord, percentile, request_metrics, summarize
from roseinfer.bench.roofline import continuous_batching_floor, decode_step_cost, measure_peaks, prefill_cost
from roseinfer.bench.workloads import (
    mixed_output_lengths,
    poisson_arrivals,
    random_prompts,
    shared_prefix_prompts,
)
from roseinfer.config import PRESETS

ROOT = Path(__file__).resolve().parents[1]


def test_percentiles_and_summary():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert math.isnan(percentile([], 50))
    s = summarize([0.001, 0.002, 0.003], scale=1000)
    assert s["p50"] == pytest.approx(2.0) and s["mean"] == pytest.approx(2.0) and s["n"] == 3


def test_request_metrics_follow_vllm_definitions():
    r = RequestRecord(start=10.0, token_times=[10.5, 10.7, 11.1], prompt_tokens=4, end=11.1, scheduled=10.2)
    assert r.ttft == pytest.approx(0.5)
    assert r.tpot == pytest.approx((1.1 - 0.5) / 2)  # (latency - TTFT) / (tokens - 1)
    assert r.itls == pytest.approx([0.2, 0.4])
    assert r.queue_wait == pytest.approx(0.2)
    m = request_metrics([r, RequestRecord(start=10.0, token_times=[10.4], end=10.4)], duration_s=2.0)
    assert m["total_output_tokens"] == 4
    assert m["output_throughput_tok_s"] == 2.0
    assert m["tpot_ms"]["n"] == 1  # a one-token request has no TPOT
    assert m["ttft_ms"]["p50"] == pytest.approx(450.0)


def test_workloads_are_reproducible_and_shaped():
    a = random_prompts(5, (3, 9), 7, seed=1)
    assert a == random_prompts(5, (3, 9), 7, seed=1)
    assert all(3 <= len(r.prompt_token_ids) <= 9 and r.max_new_tokens == 7 for r in a)
    m = mixed_output_lengths(50, output_len=(8, 128), seed=2)
    assert len({r.max_new_tokens for r in m}) > 10
    shared = shared_prefix_prompts(6, prefix_len=20, suffix_len=4, output_len=5, num_prefixes=2)
    assert (
        shared[0].prompt_token_ids[:20] == shared[2].prompt_token_ids[:20] != shared[1].prompt_token_ids[:20]
    )
    gaps = poisson_arrivals(2000, rate=50.0, seed=0)
    assert gaps[0] == 0 and 2000 / gaps[-1] == pytest.approx(50, rel=0.1)
    assert poisson_arrivals(3, float("inf")) == [0.0, 0.0, 0.0]


def test_roofline_costs_and_floor():
    cfg = PRESETS["gpt2"]
    one = decode_step_cost(cfg, [100], elem_bytes=2)
    many = decode_step_cost(cfg, [100] * 64, elem_bytes=2)
    # Weights are read once a step whatever the batch: bytes grow far slower than FLOPs.
    assert many.flops == pytest.approx(64 * one.flops, rel=0.01)
    assert many.bytes < 3 * one.bytes
    assert prefill_cost(cfg, [256], 2).flops > 150 * one.flops  # 256 tokens, but one LM-head row
    peaks = {"matmul_flops": 1e15, "mem_bytes_s": 3e12}
    floor = continuous_batching_floor(cfg, [256] * 8, [4] * 8, max_batch=8, elem_bytes=2, peaks=peaks)
    assert floor["decode_steps"] == 3 and floor["floor_s"] > 0
    measured = measure_peaks("cpu", small=True)
    assert measured["matmul_flops"] > 1e8 and measured["mem_bytes_s"] > 1e8


@pytest.mark.parametrize("preset", ["gpt2", "smollm2-135m", "qwen2.5-0.5b"])
def test_roofline_reads_every_matmul_weight_once_and_the_kv_heads_cache(preset):
    """A decode step's bytes are the model's matmul weights (norms, biases and the position table aside) plus
    K/V shaped by the KV heads: GQA's smaller cache is what the floor counts."""
    from roseinfer.models.registry import num_parameters

    cfg = PRESETS[preset]
    small = cfg.n_embd * (cfg.n_positions if cfg.family == "gpt2" else 0)  # GPT-2's position table
    small += cfg.n_layer * 16 * cfg.n_embd  # norms and biases: under 16 vectors a layer
    weights = decode_step_cost(cfg, [0], elem_bytes=4).bytes / 4 - 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim
    assert num_parameters(cfg) - small <= weights <= num_parameters(cfg)
    kv_per_token = decode_step_cost(cfg, [1001], 4).bytes - decode_step_cost(cfg, [1], 4).bytes
    assert kv_per_token == 1000 * 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * 4


def test_kv_cache_step_timings_cover_every_context_and_leave_no_request_behind():
    """Notebook 01's measurement: every context and arm timed `repeats` times; its schedulers' blocks freed."""
    from roseinfer import InferenceEngine
    from roseinfer.bench.kv_cache import time_steps

    engine = InferenceEngine.from_pretrained("gpt2-tiny", dtype="float32")
    free = engine.block_manager.num_free_blocks
    times = time_steps(engine, [8, 20], repeats=2)
    assert {arm: sorted(t) for arm, t in times.items()} == {"recompute": [8, 20], "kv_cache": [8, 20]}
    assert all(len(runs) == 2 and min(runs) > 0 for arm in times.values() for runs in arm.values())
    assert engine.block_manager.num_free_blocks == free


def test_machine_peaks_measured_once_per_machine(tmp_path, monkeypatch):
    from roseinfer.bench import results, roofline

    monkeypatch.setenv("ROSEINFER_RESULTS_DIR", str(tmp_path))
    calls = []

    def fake_measure(device, dtype, small):  # each measurement a different value, as on a noisy machine
        calls.append(small)
        return {"matmul_flops": float(len(calls)), "mem_bytes_s": 10.0 - len(calls), "copy_bytes_s": 1.0}

    monkeypatch.setattr(roofline.measure_peaks, "__wrapped__", fake_measure)
    first = roofline.machine_peaks("cpu", measurements=3)
    assert len(calls) == 3
    assert first["matmul_flops"] == 3.0 and first["mem_bytes_s"] == 9.0  # the best measurement of each
    assert first["mem_bytes_s_runs"] == [9.0, 8.0, 7.0] and first["mem_bytes_s_median"] == 8.0
    assert roofline.machine_peaks("cpu", measurements=3) == first and len(calls) == 3  # kept, not re-measured
    assert (tmp_path / "cpu" / "peaks.json").exists()
    roofline.machine_peaks("cpu", torch.bfloat16, measurements=3)  # another dtype is measured on its own
    assert len(calls) == 6
    roofline.machine_peaks("cpu", small=True, measurements=2)  # token sizes: measured each time, never kept
    roofline.machine_peaks("cpu", small=True, measurements=2)
    assert calls[6:] == [True] * 4
    # Another boot (a new session's machine, same processor name) measures its own and replaces the file.
    monkeypatch.setattr(results, "boot_id", lambda: "another-boot")
    assert roofline.machine_peaks("cpu", measurements=3)["mem_bytes_s_runs"] == [-1.0, -2.0, -3.0]
    assert len(calls) == 13 and len(json.loads((tmp_path / "cpu" / "peaks.json").read_text())) == 1


def _run(script: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_benchmark_scheduler_smoke(tmp_path):
    out = tmp_path / "s.json"
    text = _run(
        "benchmark_scheduler.py",
        "--model",
        "gpt2-tiny",
        "--mode",
        "offline",
        "--num-requests",
        "4",
        "--max-new-tokens",
        "6",
        "--repeat-runs",
        "1",
        "--output-json",
        str(out),
        "--pretok",
    )
    assert "decode" in text and "TTFT".lower() in text.lower()
    result = json.loads(out.read_text())
    assert result["benchmark"] == "scheduler" and result["metrics"]["total_output_tokens"] == 24
    for key in (
        "benchmark",
        "variant",
        "config",
        "metrics",
        "device",
        "device_name",
        "torch_version",
        "git_commit",
        "date",
    ):
        assert key in result


def test_benchmark_streaming_smoke(tmp_path):
    out = tmp_path / "st.json"
    _run(
        "benchmark_streaming.py",
        "--model",
        "gpt2-tiny",
        "--num-requests",
        "4",
        "--max-new-tokens",
        "6",
        "--repeat-runs",
        "1",
        "--warmup-runs",
        "0",
        "--submit-interval-ms",
        "2",
        "--stream-interval",
        "2",
        "--no-stop-on-eos",
        "--output-json",
        str(out),
    )
    m = json.loads(out.read_text())["metrics"]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms", "queue_wait_ms"):
        assert {"p50", "p95", "p99"} <= set(m[key])
    assert m["output_throughput_tok_s"] > 0 and m["total_output_tokens"] == 24


def test_benchmark_serving_smoke(tmp_path, hf_tiny_dir):
    from roseinfer import InferenceEngine
    from roseinfer.server.app import ServerSettings, create_app
    from roseinfer.server.manager import SchedulerManager

    engine = InferenceEngine.from_pretrained(str(hf_tiny_dir), num_kv_blocks=128)
    out = tmp_path / "sv.json"
    with LiveServer(create_app(SchedulerManager(engine), ServerSettings(served_model_name="tiny"))) as live:
        _run(
            "benchmark_serving.py",
            "--base-url",
            live.base_url,
            "--num-prompts",
            "6",
            "--input-len",
            "8",
            "--output-len",
            "5",
            "--request-rate",
            "50",
            "--ignore-eos",
            "--no-progress",
            "--output-json",
            str(out),
        )
    m = json.loads(out.read_text())["metrics"]
    assert m["failed"] == 0 and m["num_requests"] == 6 and m["total_output_tokens"] == 30


def test_compare_hf_smoke(tmp_path):
    out = tmp_path / "c.json"
    text = _run(
        "compare_hf.py",
        "--model",
        "gpt2-tiny",
        "--num-requests",
        "4",
        "--repeat-runs",
        "1",
        "--workload",
        "mixed",
        "--systems",
        "roseinfer",
        "hf_generate",
        "--output-json",
        str(out),
        "--quick-roofline",
    )
    block = json.loads(out.read_text())["metrics"]["mixed"]
    assert block["hf_generate"]["same_greedy_tokens"] == 4, text
    assert out.with_suffix(".png").exists()


def test_greedy_agreement_measures():
    from roseinfer.bench.same_answer import agreement, matching_prefix

    reference = [[1, 2, 3, 4], [5, 6, 7, 8]]
    drifted = [[1, 2, 3, 4], [5, 6, 0, 0]]  # the second request flips at its third token
    assert agreement(drifted, reference) == 0.5
    assert matching_prefix(drifted, reference) == (1 + 0.5) / 2
    assert agreement(reference, reference) == matching_prefix(reference, reference) == 1.0


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_compare_engines_smoke(tmp_path, preset):
    """The peer harness end to end with the engines CI has (roseinfer, HF), on both families' weights; a peer
    without its venv is skipped. The Llama family's run is roseinfer fp32 against transformers alone (int8
    is the same code for both families)."""
    from roseinfer.kernels.cpu.bindings import load_f32_linear_kernel

    ours = ["roseinfer-fp32"]
    if preset == "gpt2-tiny" and load_f32_linear_kernel():  # int8 needs a compiler
        ours.append("roseinfer-int8")
    out = tmp_path / "e.json"
    text = _run(
        "compare_engines.py",
        "--preset",
        preset,
        "--engines",
        *ours,
        "hf",
        "ct2-int8",
        "--num-requests",
        "3",
        "--max-new-tokens",
        "5",
        "--repeat-runs",
        "1",
        "--peers-dir",
        str(tmp_path / "no-peers"),
        "--output-json",
        str(out),
        "--quick-roofline",
    )
    assert "skipping ct2-int8:" in text and "make peer-ct2" in text
    result = json.loads(out.read_text())
    assert result["benchmark"] == "compare_engines" and result["config"]["completed_rounds"] == 1
    assert set(result["config"]["skipped"]) == {"ct2-int8"}
    assert set(result["config"]["cpu_flags"]) >= {"avx512f", "avx512_bf16"}
    for name, block in result["metrics"].items():
        assert set(block["engines"]) == {*ours, "hf"}, name
        assert block["roofline_tok_s"]["fp32_tok_s"] > 0
        for engine in block["engines"].values():
            assert engine["exact_output_lengths"] and len(engine["runs_tok_s"]) == 1
        assert block["engines"]["hf"]["same_tokens_as_reference"] == 1.0, (name, text)
        for name_ in ours[1:]:  # int8: its agreement is measured and reported, not assumed
            assert 0 <= block["engines"][name_]["same_tokens_as_reference"] <= 1
        assert block["engines"]["hf"]["matching_prefix_with_reference"] == 1.0, (name, text)
        for engine, s in block["engines"].items():  # judged at the fastest reading; the readings beside it kept
            ceiling = block["roofline_tok_s"][f"{s['roofline_dtype']}_tok_s"]
            assert s["fraction_of_own_roofline"] == pytest.approx(s["output_throughput_tok_s"] / ceiling), engine
            (beside,) = s["run_roofline_tok_s"]
            assert beside[f"{s['roofline_dtype']}_tok_s"] <= ceiling * (1 + 1e-9), (name, engine)
    # The bandwidth is read before the first engine and after each: a run keeps the better reading either side.
    readings = result["config"]["bandwidth_readings_gb_s"]
    assert len(readings) == len(ours) + 2
    for i, engine in enumerate([*ours, "hf"]):
        (beside,) = result["config"]["run_bandwidth_gb_s"][engine]
        assert beside == {k: max(readings[i][k], readings[i + 1][k]) for k in beside}, engine
    assert out.with_suffix(".png").exists()


def test_llama_peer_weights_carry_a_cut_gpt2_tokenizer_every_converter_reads(tmp_path):
    """SmolLM2's 49,152 ids: GPT-2's first 49,151 tokens under their own ids, end of text as the last."""
    from transformers import AutoTokenizer

    from roseinfer.bench.peer_models import END_OF_TEXT, write_cut_bpe_tokenizer
    from roseinfer.tokenizer import GPT2Tokenizer

    write_cut_bpe_tokenizer(tmp_path / "tokenizer.json", 49152)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    cut = AutoTokenizer.from_pretrained(tmp_path)
    assert len(cut) == 49152 and cut.convert_tokens_to_ids(END_OF_TEXT) == 49151
    text = "Hello world, the cut vocabulary keeps every ordinary token."
    assert cut.encode(text) == GPT2Tokenizer.from_pretrained().encode(text)
    assert max(cut.encode("Zeitgeist 3333 Ελληνικά")) < 49151  # rarer pieces fall back to shorter merges


def test_source_diff_shows_only_the_changed_lines():
    from roseinfer.bench.diff import source_diff
    from roseinfer.history.lock_per_token import LockPerTokenManager
    from roseinfer.server.manager import SchedulerManager

    diff = source_diff(LockPerTokenManager._collect_step_records, SchedulerManager._collect_step_records)
    assert diff.startswith("--- roseinfer.history.lock_per_token.LockPerTokenManager._collect_step_records")
    assert "+    with self._lock:" in diff and "-        with self._lock:" in diff
    assert source_diff(SchedulerManager._idle, SchedulerManager._idle) == ""


def _branchy(x):
    if x > 1:
        x += 1

        return x * 2
    y = x
    if x < 0:
        return -x
    elif x == 0:
        return 1
    return y


def test_branch_diff_removes_only_the_named_branches():
    import pytest

    from roseinfer.bench.diff import branch_diff

    diff = branch_diff(_branchy, "x > 1")
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == ["+    if x > 1:", "+        x += 1", "+", "+        return x * 2"]
    assert not any(line.startswith("-") and not line.startswith("---") for line in diff.splitlines())
    with pytest.raises(ValueError):
        branch_diff(_branchy, "x == 3")
    # removing the head of an if/elif chain leaves its next branch as the head, not a dangling elif
    chain = branch_diff(_branchy, "x < 0")
    assert "-    if x == 0:" in chain and "+    elif x == 0:" in chain


def test_plots_show_spread_only_where_there_are_runs_and_plain_log_labels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from roseinfer.bench import plots

    fig, (ax1, ax2, ax3) = plots.figure(3)
    # Runs per point: a band from min to max, the line through the medians, named variants in the legend.
    plots.curve(
        ax1,
        {"recompute": ([16, 512], [[10, 12, 30], [600, 650, 850]]), "KV cache": ([16, 512], [5, 6])},
        "context",
        "ms",
        logy=True,
    )
    assert [t.get_text() for t in ax1.get_legend().get_texts()] == ["recompute", "KV cache"]
    assert len(ax1.collections) == 2  # recompute's band and its run dots; KV cache has single values, neither
    fig.canvas.draw()
    labels = [t.get_text() for t in ax1.yaxis.get_majorticklabels() + ax1.yaxis.get_minorticklabels()]
    assert labels and not any("times" in s or "^" in s or "e+" in s for s in labels)
    # Bars: a whisker only for the variant with several runs; the old call signature still works.
    plots.before_after_bars(ax2, ["polling", "event"], [[4.4, 4.8, 5.1], [2.4]], "ms", "t")
    assert len(ax2.containers) == 2  # the bars, and one errorbar
    plots.before_after_bars(ax3, ["a", "b"], [[1], [2]], "x")
    assert len(ax3.containers) == 1
    assert plots.plain_number(7020) == "7,020" and plots.plain_number(0.0123) == "0.0123"
    plots.save(fig, tmp_path / "f.png")


def test_benchmark_kernel_build_times_a_fresh_build(tmp_path):
    import os

    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "benchmark_kernel_build.py"), "--repeats", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "ROSEINFER_RESULTS_DIR": str(tmp_path)},
    )
    if "did not build here" in out.stdout:
        pytest.skip("no C compiler or no AVX512-BF16 here")
    assert out.returncode == 0, out.stdout + out.stderr
    metrics = json.loads((tmp_path / "cpu" / "kernel_build.json").read_text())["metrics"]
    assert all(0 < m["median_s"] < 120 for m in metrics.values()) and len(metrics) == 2


def test_notebook_save_files_results_under_the_device_measured(tmp_path, monkeypatch):
    """Notebook 11 times the CPU even where CUDA is present: its results must not be filed as the GPU's."""
    from roseinfer.bench import notebook

    monkeypatch.setenv("ROSEINFER_RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("ROSEINFER_NOTEBOOK_SIZES", raising=False)
    monkeypatch.setattr(notebook, "device", lambda: "cuda")  # a GPU host, without needing one
    monkeypatch.setattr("roseinfer.bench.results.device_tag", lambda d: "h100" if str(d) == "cuda" else "cpu")
    monkeypatch.setattr("roseinfer.bench.results.device_name", lambda d: "NVIDIA H100" if str(d) == "cuda" else "a CPU")
    cpu_run = notebook.save("nbXX", "a-vs-b", {}, {"x": 1}, measured_on="cpu")
    gpu_run = notebook.save("nbYY", "a-vs-b", {}, {"x": 1})
    assert cpu_run == tmp_path / "cpu" / "nbXX.json" and gpu_run == tmp_path / "h100" / "nbYY.json"
    saved = json.loads(cpu_run.read_text())
    assert saved["device"] == "cpu" and saved["device_name"] == "a CPU"


def test_the_read_bandwidth_takes_the_fastest_reader_roseinfers_kernel_included(monkeypatch):
    from roseinfer.bench import roofline
    from roseinfer.kernels.cpu.bindings import load_f32_linear_kernel

    own = roofline._own_gemv_case(torch.device("cpu"), small=True)
    assert (own is None) == (load_f32_linear_kernel() is None)
    if own is not None:
        run, weight_bytes = own
        run()
        assert weight_bytes == 4 * 64 * 256 * 4  # four fp32 matrices of 256 x 64
    # the fastest reader is the one the meter reports, whichever of the three it is
    def fast() -> None:
        pass

    monkeypatch.setattr(roofline, "_own_gemv_case", lambda dev, small: (fast, 1 << 30))
    monkeypatch.setattr(roofline, "_best_time", lambda fn, reps, dev: 1e-9 if fn is fast else 1.0)
    assert roofline.read_bandwidth_meter("cpu", torch.float32, small=True)() == pytest.approx((1 << 30) / 1e-9)
