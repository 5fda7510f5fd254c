"""Notebook 13's analysis helpers (roseinfer.bench.final_server) on made-up sweeps."""

from __future__ import annotations

import json

import pytest

from roseinfer.bench import final_server
from roseinfer.config import PRESETS


def _run(tok_s: float, ttft: float, tpot: float) -> dict:
    return {"output_throughput_tok_s": tok_s, "ttft_ms": {"p50": ttft}, "tpot_ms": {"p50": tpot},
            "total_output_tokens": 64}


def _sweep(levels=(4, 16), n=8) -> dict:
    """A closed loop obeying Little's law: rate = c * n / (TTFT + (n - 1) * TPOT)."""
    out = {}
    for name, (ttft, tpot) in {"roseinfer": (100.0, 20.0), "transformers serve": (300.0, 80.0)}.items():
        out[name] = {}
        for c in levels:
            runs = []
            for k in range(5):
                t, p = ttft * c / 4 * (1 + k / 100), tpot * c / 4 * (1 + k / 100)
                runs.append(_run(c * n / ((t + (n - 1) * p) / 1000), t, p))
            out[name][c] = runs
    return out


def test_runs_at_takes_the_p50_of_distributions_and_plain_numbers_as_they_are():
    sweep = _sweep()
    assert final_server.runs_at(sweep, "roseinfer", 4, "ttft_ms")[0] == 100.0
    assert final_server.runs_at(sweep, "roseinfer", 4, "output_throughput_tok_s")[0] == pytest.approx(
        4 * 8 / 0.24)


def test_text_agreement_counts_identical_answers_and_the_matching_prefix():
    same, prefix = final_server.text_agreement(["abcd", "abXX", "xyz"], ["abcd", "abcd", "xyz"])
    assert same == 2
    assert prefix == pytest.approx((1 + 0.5 + 1) / 3)


def test_compare_orients_every_verdict_transformers_to_roseinfer():
    verdicts = final_server.compare(_sweep(), [4, 16])
    assert set(verdicts) == {(k, c) for k in final_server.METRICS for c in (4, 16)}
    assert all(v.better for v in verdicts.values())  # roseinfer is faster on every figure of this sweep
    assert verdicts["tpot_ms", 4].labels == ("transformers serve", "roseinfer")
    assert verdicts["tpot_ms", 4].ratio == pytest.approx(4.0, rel=0.02)


def test_tpot_apart_splits_roseinfer_tpot_and_checks_littles_law(capsys):
    peaks = {"mem_bytes_s": 50e9, "matmul_flops": 200e9}
    bare = {4: [10.0, 11.0, 12.0], 16: [30.0, 31.0, 32.0]}
    out = final_server.tpot_apart(_sweep(), [4, 16], PRESETS["gpt2"], 36, 2, peaks, bare, 8)
    assert out["little_error"] < 1e-9
    assert out["bare"] == {4: 11.0, 16: 31.0}
    assert 0 < out["floor"][4] < out["floor"][16] < out["tpot"][16]
    assert out["tpot"][4] == pytest.approx(20.0 * 1.02)
    printed = capsys.readouterr().out
    assert "floor" in printed and "Little's law" in printed


def test_plot_sweep_draws_three_panels():
    fig = final_server.plot_sweep(_sweep(), [4, 16], {"roseinfer": "roseinfer (bfloat16)"})
    assert len(fig.axes) == 3
    assert "roseinfer (bfloat16)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_committed_vllm_reads_the_served_run(tmp_path, monkeypatch, capsys):
    engines = {f"{e}-{d}": {"output_throughput_tok_s": tok, "runs_output_throughput_tok_s": [tok - 1, tok, tok + 1]}
               for (e, d), tok in {("roseinfer", "fp32"): 100, ("vllm", "fp32"): 100, ("roseinfer", "bf16"): 200,
                                   ("vllm", "bf16"): 150}.items()}
    run = {"metrics": {"engines": engines}, "device_name": "a CPU", "date": "2026-01-01T00:00", "git_commit": "abc",
           "config": {"num_prompts": 16, "input_len": 64, "output_len": 16, "client": "vllm bench serve"}}
    (tmp_path / "results" / "cpu").mkdir(parents=True)
    (tmp_path / "results" / "cpu" / "compare_served.json").write_text(json.dumps(run))
    monkeypatch.setattr(final_server, "REPO_ROOT", tmp_path)
    assert final_server.committed_vllm() == run
    printed = capsys.readouterr().out
    assert "fp32: vllm 100 -> roseinfer 100 tok/s (1.00x; 3 runs each, roseinfer's overlapping" in printed
    assert "bf16: vllm 150 -> roseinfer 200 tok/s (1.33x; 3 runs each, roseinfer's above" in printed
    assert final_server.committed_vllm("missing") is None


def test_paired_ratios_are_oriented_so_above_one_is_roseinfer_better():
    sweep = _sweep()
    assert final_server.paired(sweep, 4, "tpot_ms") == pytest.approx([4.0] * 5)
    assert all(r > 1 for r in final_server.paired(sweep, 16, "output_throughput_tok_s"))
    line = final_server.describe_paired(sweep, [4, 16])
    assert line.startswith("Paired by pass, roseinfer's output tok/s over transformers serve's: 4 in flight")
    assert "5 of 5 > 1" in line


def test_hf_bare_step_times_transformers_decode_step(tmp_path, capsys):
    from roseinfer.bench.peer_models import make_hf_weights

    model_dir = make_hf_weights(tmp_path, "gpt2-tiny", seed=0, projection_scale=3.0)
    assert final_server.hf_bare_step_ms(str(model_dir), batch=2, context=8, steps=5) > 0
    assert capsys.readouterr().err == ""  # its loading bar and notices are kept out of the notebook
