"""Notebooks 08 and 09: the fair gather baseline, the C kernel's loop, the twin's quiet load."""

from __future__ import annotations

import logging

from roseinfer import InferenceEngine
from roseinfer.bench import one_launch
from roseinfer.bench import paged_attention as pa


def _row(before, reused):
    return {"before_ms": before, "reused_ms": reused, "after_ms": [1.0]}


def test_copy_baseline_takes_the_faster_gather_by_median():
    assert pa.copy_baseline(_row([2.0, 2.1, 2.2], [3.0, 2.9, 2.8])) == ("gather + SDPA", [2.0, 2.1, 2.2])
    assert pa.copy_baseline(_row([9.0, 8.0, 9.5], [3.0, 2.9, 2.8])) == ("gather into kept buffers", [3.0, 2.9, 2.8])


def test_show_c_loop_prints_the_fp32_block_loop_without_prefetches(capsys):
    pa.show_c_loop()
    out = capsys.readouterr().out
    assert out.startswith("for (int64_t start = 0; start < context")
    assert "fp32_scores(" in out and "add_values(" in out and "store_normalized(" in out.splitlines()[-1]
    assert not any(w in out for w in ("prefetch", "#pragma", "bf16_scores", "add_block_values", "next_"))
    assert out.count("{") == out.count("}")
    assert len(out.splitlines()) < 40


def test_narrow_twin_loads_without_the_tokenizer_warning(caplog):
    engine = InferenceEngine.from_pretrained("llama-tiny", dtype="float32", num_kv_blocks=64)
    level = logging.getLogger("roseinfer").level
    caplog.clear()  # the test's own engine warned: llama-tiny has no tokenizer either
    with caplog.at_level(logging.WARNING, logger="roseinfer"):
        one_launch.narrow_twin(engine, width=32)
    assert not [r for r in caplog.records if "no tokenizer" in r.getMessage()]
    assert logging.getLogger("roseinfer").level == level
