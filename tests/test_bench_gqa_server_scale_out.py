"""The small analysis helpers notebooks 12-14 call in one line (roseinfer.bench.gqa, final_server, scale_out),
on made-up runs: fast, no model and no server."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib
import pytest

from roseinfer.bench import final_server, gqa, scale_out
from roseinfer.config import PRESETS

matplotlib.use("Agg")

MHA, GQA = gqa.KV_HEADS


def _gqa_runs():
    runs = {MHA: [dict(tok_s=100.0 + i, most_in_a_step=7, mean_in_a_step=4.7, step_ms=48.0, preemptions=5)
                  for i in range(5)],
            GQA: [dict(tok_s=220.0 + i, most_in_a_step=16, mean_in_a_step=10.9, step_ms=50.0, preemptions=1)
                  for i in range(5)]}
    attn = {MHA: [4.9, 5.0, 4.8, 5.1, 4.95], GQA: [2.1, 2.2, 2.0, 2.15, 2.12]}
    engines = {MHA: SimpleNamespace(num_kv_blocks=30, config=SimpleNamespace(block_size=16)),
               GQA: SimpleNamespace(num_kv_blocks=91, config=SimpleNamespace(block_size=16))}
    return gqa.summarize(runs, attn, engines, 96, 16, 2048)


def test_gqa_summary_splits_throughput_and_prints_one_row_a_figure():
    s = _gqa_runs()
    assert s.tokens == {MHA: 480, GQA: 1456} and s.whole == {MHA: 5, GQA: 15}
    assert s.ratio("mean") == pytest.approx(10.9 / 4.7) and s.ratio("step") == pytest.approx(50 / 48)
    assert s.ratio("read") == pytest.approx(1 / 3)
    assert s.v_tput.better and s.v_attn.better and s.v_tput.ratio == pytest.approx(222 / 102)
    table = s.table()
    rows = table.splitlines()
    assert rows[0].split() == ["MHA", "GQA", "GQA", "/", "MHA"] and len(rows) == 10
    assert "480" in table and "1456" in table and "3.03x" in table  # 1456 / 480
    assert any(r.startswith("  bytes it reads (MiB)") and "144" in r and "48" in r for r in rows)
    assert len(gqa.plot(s, "title").axes) == 3


def test_gqa_kernel_lines_point_at_the_kernel_with_line_numbers():
    text = gqa.kernel_lines("heads = kv_heads * group", "key + (h / group)")
    lines = text.splitlines()
    assert len(lines) >= 2 and all(line.startswith("paged_decode.c:") for line in lines)
    source = gqa.KERNEL.read_text().splitlines()
    for line in lines:
        number = int(line.split(":")[1])
        assert line.split(": ", 1)[1] == source[number - 1].strip()


def _sweep():
    def run(tok_s, ttft, tpot):
        return {"output_throughput_tok_s": tok_s, "ttft_ms": {"p50": ttft}, "tpot_ms": {"p50": tpot}}
    return {"roseinfer": {4: [run(160, 100, 15)] * 3, 16: [run(210, 470, 20)] * 3},
            "transformers serve": {4: [run(32, 320, 105)] * 3, 16: [run(70, 940, 110)] * 3}}


def test_final_server_paired_table_has_every_metric_at_every_level():
    table = final_server.paired_table(_sweep(), [4, 16]).splitlines()
    assert len(table) == 3 and "TTFT p50" in table[0] and "TPOT p50" in table[0]
    assert table[1].split()[0] == "4" and "5.00x" in table[1] and "3.20x" in table[1] and "7.00x" in table[1]
    assert table[2].split()[0] == "16" and "2.00x" in table[2] and "5.50x" in table[2]


def test_final_server_serving_share_and_littles_law_line_agree_with_the_bound(capsys):
    apart = {"tpot": {4: 14.7, 16: 19.7}, "bare": {4: 9.3, 16: 14.6}}
    share = final_server.serving_share(apart)
    assert share[4] == pytest.approx(5.4 / 14.7) and share[16] == pytest.approx(5.1 / 19.7)
    peaks = {"mem_bytes_s": 50e9, "matmul_flops": 200e9}
    final_server.tpot_apart(_sweep(), [4, 16], PRESETS["gpt2"], 36, 2, peaks, {4: [9.0], 16: [14.0]}, 8)
    assert f"assert under {final_server.LITTLE_BOUND:.0%}" in capsys.readouterr().out


def _table():
    def setup(tok_s, ttft, hit, found, replicas):
        return {"tok_s": tok_s, "ttft_p50_ms": ttft, "ttft_p99_ms": [3000.0] * 5, "hit_rate": hit,
                "found_tokens": found, "replica_hit_rates": replicas}
    return {"one replica": setup([78, 80, 72, 75, 75], [270, 880, 490, 730, 850], [0.64] * 5, [6688] * 5,
                                 [[0.64] * 5]),
            "round_robin": setup([43, 50, 59, 51, 39], [1100, 790, 810, 700, 1050], [0.46] * 5, [4864] * 5,
                                 [[0.41] * 5, [0.52] * 5]),
            "cache_aware": setup([71, 68, 69, 57, 78], [310, 670, 470, 400, 610], [0.67] * 5, [6992] * 5,
                                 [[0.65] * 5, [0.68] * 5])}


def test_scale_out_verdicts_envelope_and_tables():
    table = _table()
    v = scale_out.verdicts(table)
    assert set(v) == {"hit", "tok_s", "ttft", "ttft_p99", "pair_tok_s", "pair_ttft"}
    assert v["hit"].better and v["tok_s"].better and not v["pair_tok_s"].better
    assert v["pair_tok_s"].labels == ("one 2-thread replica", "two 1-thread replicas")
    ratios = scale_out.paired_ratios(table, "tok_s", *scale_out.PAIR)
    assert ratios[0] == pytest.approx(71 / 78) and len(ratios) == 5
    runs = {"round_robin": [{"duration_s": 10.0}] * 5, "cache_aware": [{"duration_s": 7.5}] * 5}
    env = scale_out.envelope(table, runs, ms_per_token=2.0)
    assert env["extra_tokens"] == 2128 and env["saved"] == pytest.approx(2.128) and env["gap"] == pytest.approx(2.5)
    assert "2128 more prompt tokens" in scale_out.describe_envelope(env)
    rows = scale_out.replica_hit_table(table).splitlines()
    assert rows[1].split()[-2:] == ["0.64", "-"] and rows[2].split()[-2:] == ["0.41", "0.52"]
    assert len(scale_out.plot(table, "title").axes) == 3
