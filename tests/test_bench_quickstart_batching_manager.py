"""Notebook 00's greedy-loop check, 02's step table and 04's min-max table."""

from __future__ import annotations

from roseinfer.bench import solutions
from roseinfer.bench.exercises.quickstart import check_greedy_loop
from roseinfer.bench.static_batching import StepFit, step_envelope


def test_greedy_loop_check(engine):  # conftest's tiny HF engine
    assert check_greedy_loop(solutions.greedy_loop, engine, n=3).startswith("PASS")

    def stub(engine, ids, n):
        raise NotImplementedError

    assert check_greedy_loop(stub, engine, n=3).startswith("not written yet")

    def with_prompt(engine, ids, n):
        return list(ids) + solutions.greedy_loop(engine, ids, n)

    assert "prompt too" in check_greedy_loop(with_prompt, engine, n=3)

    def first_row(engine, ids, n):
        ids, new = list(ids), []
        for _ in range(n):
            new.append(int(engine.prompt_logits(ids)[0].argmax()))
            ids.append(new[-1])
        return new

    msg = check_greedy_loop(first_row, engine, n=3)
    assert not msg.startswith("PASS")


def test_step_envelope_table():
    fit = StepFit([1, 2, 4, 8], [0.0156, 0.0154, 0.0159, 0.0206], 0.014, 0.00075, (0.013, 0.0144),
                  (0.0007, 0.0012), 494e6, 60e9, 0.25e9, 221e9)
    text = step_envelope(fit)
    lines = text.splitlines()
    assert len(lines) == 5
    assert "15.6" in lines[1] and "20.6" in lines[1]
    assert "1.32" in lines[2]
    assert lines[3].split()[-1] == "8.2" or lines[3].split()[-1] == "8.3"
    assert lines[4].split()[-1] == "9.0"  # 8 rows x 1.13 ms


def test_numbers_table_prints_min_max():
    from roseinfer.bench.scheduler_manager import Numbers
    from roseinfer.bench.stats import verdict

    v = verdict("TTFT p50, 8 streams", [600.0, 622.0, 898.0], [21.0, 28.0, 30.0], "ms", False)
    g = verdict("throughput", [90.0, 91.0, 92.0], [390.0, 395.0, 400.0], "tok/s", True)
    n = Numbers(8, [("TTFT p50, 8 streams", v, "ms")], 1.0, g, [], {"queue_wait": 4.0, "prefill_to_first_token": 20.0},
                20.0, 5.0)
    row = str(n).splitlines()[1]
    assert "622 (600-898) ms" in row and "28.0 (21.0-30.0) ms" in row
