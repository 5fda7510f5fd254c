"""Notebook 05's helpers (roseinfer/bench/wakeup.py): the summary's arithmetic and checks, the lost wake-up."""

from __future__ import annotations

import pytest

from roseinfer.bench import wakeup
from roseinfer.history.clear_outside_lock import ClearOutsideLockManager

NAMES = {"polling": "polling every 5 ms", "current": "wake-up event"}


def _light(polling_wait: float = 2.6, event_wait: float = 0.4, itl=(1.5, 1.5)) -> dict:
    """Five runs a variant in the shape light_load_runs returns: the stages add up to the mean TTFT."""
    stage = {"enter_add_request_ms": 0.01, "tokenize_ms": 0.07, "prefill_to_first_token_ms": 2.0, "delivery_ms": 0.5}
    light = {"ttft_p50_ms": {}, "ttft_mean_ms": {}, "stage_mean_ms": {}, "itl_p50_ms": {}}
    for variant, wait, gap in (("polling", polling_wait, itl[0]), ("current", event_wait, itl[1])):
        runs = [0.0, 0.05, -0.05, 0.1, -0.1]
        stages = {**{s: [v] * 5 for s, v in stage.items()}, "queue_wait_ms": [wait + r for r in runs]}
        light["stage_mean_ms"][variant] = stages
        light["ttft_mean_ms"][variant] = [sum(stages[s][i] for s in stages) for i in range(5)]
        light["ttft_p50_ms"][variant] = [t - 0.2 for t in light["ttft_mean_ms"][variant]]
        light["itl_p50_ms"][variant] = [gap + r / 10 for r in runs]
    return light


def _idle(polling_wakeups: float = 193.0) -> dict:
    return {"polling": {"wakeups_per_s": [polling_wakeups] * 5, "cpu_ms_per_s": [16.0, 15.5, 20.0, 16.5, 29.0]},
            "current": {"wakeups_per_s": [0.0] * 5, "cpu_ms_per_s": [0.0] * 5}}


def test_summary_arithmetic_table_and_directions():
    numbers = wakeup.summarize(_light(), _idle(), NAMES, gpt2_ttft_ms=20.9)
    assert numbers.nap_ms == pytest.approx(1000 / 193)
    assert numbers.added_ms == pytest.approx(2.2)
    assert numbers.added_wait_ms == pytest.approx(2.2)
    assert numbers.cpu_per_wakeup_us == pytest.approx(16.5 * 1000 / 193)
    assert numbers.ttft.better and not numbers.itl.significant and numbers.idle_apart
    text = str(numbers)
    assert "queue wait" in text and "= TTFT" in text and "+2.20" in text
    assert "with gpt2" in text and "every run apart" in text
    assert len(text.splitlines()) < 16  # a small table, not paragraphs
    numbers.assert_directions()


@pytest.mark.parametrize("light, idle, message", [
    (_light(polling_wait=0.4, event_wait=2.6), _idle(), "cut the light-load TTFT"),
    (_light(polling_wait=5.0), _idle(), "about half a nap"),
    (_light(itl=(1.5, 2.0)), _idle(), "tokens should not move"),
])
def test_assert_directions_fails_when_a_claim_does_not_hold(light, idle, message):
    with pytest.raises(AssertionError, match=message):
        wakeup.summarize(light, idle, NAMES).assert_directions()


def test_idle_cpu_that_overlaps_fails_and_gpt2_is_optional():
    idle = _idle()
    idle["current"]["cpu_ms_per_s"] = [0.0, 0.0, 0.0, 0.0, 16.0]
    numbers = wakeup.summarize(_light(), idle, NAMES)
    assert "with gpt2" not in str(numbers) and "the runs overlap" in str(numbers)
    with pytest.raises(AssertionError, match="less CPU while idle"):
        numbers.assert_directions()


def test_stages_that_do_not_add_up_to_the_ttft_are_refused():
    light = _light()
    light["ttft_mean_ms"]["current"][2] += 0.5
    with pytest.raises(ValueError, match="add up"):
        wakeup.summarize(light, _idle(), NAMES)


def test_the_window_loses_the_wakeup_outside_the_lock_and_not_under_it(engine):
    assert wakeup.submit_in_the_window(engine, ClearOutsideLockManager, "before_clear",
                                       served_within_s=0.3).startswith("lost wake-up")
    assert wakeup.submit_in_the_window(engine, wakeup.EventUnderLock, "before_wait") == "served"


def test_idle_runs_count_the_polling_naps_and_no_event_wakeups(engine):
    idle = wakeup.idle_runs(engine, NAMES, repeats=1, idle_seconds=0.1, settle_s=0.02)
    assert idle["polling"]["wakeups_per_s"][0] > 20 and idle["current"]["wakeups_per_s"] == [0.0]
    assert idle["current"]["cpu_ms_per_s"][0] < idle["polling"]["cpu_ms_per_s"][0]


def test_light_load_runs_shape_and_plot(engine):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from roseinfer.bench.streaming import StreamingSetup

    setup = StreamingSetup(num_requests=2, prompt="Hello", pretok=True, max_new_tokens=2, stop_on_eos=False,
                           submit_interval_ms=5)
    light = wakeup.light_load_runs(engine, NAMES, setup, repeats=1)
    assert set(light["stage_mean_ms"]["polling"]) == set(wakeup.STAGE_NAMES)
    wakeup.summarize(light, _idle(), NAMES)  # the stages add up on real runs too
    fig = wakeup.plot_wakeup(light, _idle(), NAMES, "1 request / 5 ms")
    assert len(fig.axes) == 3
    plt.close(fig)


def test_gpt2_ttft_is_none_without_a_saved_run(tmp_path, monkeypatch):
    import roseinfer.bench.results as results

    monkeypatch.setattr(results, "repo_root", lambda: tmp_path)
    assert wakeup.gpt2_ttft_ms("cpu") is None
