"""Notebook 13 keeps its fp32 server in the sweep: the paired ratios against transformers serve for either
roseinfer server, on a made-up sweep (fast, no model and no server)."""

from __future__ import annotations

import matplotlib
import pytest

from roseinfer.bench import final_server

matplotlib.use("Agg")


def _run(tok_s: float, ttft: float, tpot: float) -> dict:
    return {"output_throughput_tok_s": tok_s, "ttft_ms": {"p50": ttft}, "tpot_ms": {"p50": tpot},
            "total_output_tokens": 128}


def _sweep() -> dict:
    levels = (4, 16)
    return {final_server.OURS_FP32: {c: [_run(120.0 + i, 150.0, 30.0) for i in range(5)] for c in levels},
            final_server.OURS: {c: [_run(200.0 + i, 100.0, 15.0) for i in range(5)] for c in levels},
            final_server.PEER: {c: [_run(40.0, 300.0, 90.0) for _ in range(5)] for c in levels}}


def test_paired_defaults_to_the_default_server_and_takes_the_fp32_one():
    sweep = _sweep()
    assert final_server.paired(sweep, 4, "tpot_ms") == pytest.approx([6.0] * 5)
    assert final_server.paired(sweep, 4, "tpot_ms", final_server.OURS_FP32) == pytest.approx([3.0] * 5)
    assert final_server.paired(sweep, 16, "output_throughput_tok_s", final_server.OURS_FP32)[0] == pytest.approx(3.0)


def test_paired_table_for_the_fp32_server():
    rows = final_server.paired_table(_sweep(), [4, 16], final_server.OURS_FP32).splitlines()
    assert len(rows) == 3 and rows[1].split()[0] == "4"
    assert "3.00x" in rows[1] and "2.00x" in rows[1]  # TPOT 90 / 30, TTFT 300 / 150


def test_plot_sweep_draws_all_three_servers():
    fig = final_server.plot_sweep(_sweep(), [4, 16], {final_server.OURS_FP32: "roseinfer (float32)"})
    assert all(len(ax.get_lines()) == 3 for ax in fig.axes)
