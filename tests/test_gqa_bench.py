"""roseinfer.bench.gqa.serve_once: notebook 12's serving run, and the two factors it splits throughput into."""

import pytest

from roseinfer import InferenceEngine
from roseinfer.bench.gqa import serve_once


def test_throughput_is_sequences_a_step_over_time_a_step():
    engine = InferenceEngine.from_pretrained("llama-tiny")
    prompts = [[5 + i, 7, 9, 11 + i] for i in range(3)]
    run = serve_once(engine, prompts, max_new_tokens=6)
    assert run["most_in_a_step"] == 3 and 1 <= run["mean_in_a_step"] <= 3
    assert run["preemptions"] == 0  # ample memory: every token emitted is a token kept
    assert run["tok_s"] == pytest.approx(run["mean_in_a_step"] / run["step_ms"] * 1e3, rel=1e-6)
