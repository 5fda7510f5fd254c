"""Notebook 10's helpers: its sizes live in the package, and its pooled table says it pools."""

from roseinfer.bench import notebook
from roseinfer.bench.prefix_cache import SIZES, request_table


def test_prefix_cache_sizes_work_for_every_device(monkeypatch):
    assert set(SIZES) == {"cpu", "gpu", "ci"}
    monkeypatch.setenv("ROSEINFER_NOTEBOOK_SIZES", "tiny")
    p = notebook.sizes(**SIZES)
    assert p["model"] == "gpt2-tiny" and p["headline_load"] == 0.5  # ci overrides, the device's headline kept
    for device in ("cpu", "gpu"):
        assert {"loads", "repeats", "stream_runs", "num_prefixes"} <= set(SIZES[device])


def test_request_table_says_its_percentiles_are_pooled():
    run = {"ttfts_ms": [10.0, 20.0], "cached_tokens": [0, 16], "ttft_ms": {"p50": 15.0}}
    header = request_table({"a": {0.5: [run]}, "b": {0.5: [run]}}).splitlines()[0]
    assert "pooled p50" in header and "pooled p90" in header
