"""Notebooks 05 and 06: 05's plot leaves room above its prediction line; 06's pop_response
exercise check passes the solution and names each mistake."""

from __future__ import annotations

import dataclasses

from roseinfer.bench.exercises.accessors import check_pop_response
from roseinfer.bench.solutions import pop_response
from roseinfer.engine.sequence import FinishedRequest


def test_wakeup_plot_leaves_room_above_the_prediction():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from roseinfer.bench import wakeup

    names = {"polling": "polling every 5 ms", "current": "wake-up event"}
    light = {"ttft_p50_ms": {"polling": [4.1, 4.4, 3.7], "current": [2.1, 2.4, 2.0]}}
    idle = {"polling": {"wakeups_per_s": [197.0] * 3, "cpu_ms_per_s": [7.5] * 3},
            "current": {"wakeups_per_s": [0.0] * 3, "cpu_ms_per_s": [0.0] * 3}}
    fig = wakeup.plot_wakeup(light, idle, names, "1 request / 25 ms")
    predicted = 2.1 + 500 / 197
    assert fig.axes[0].get_ylim()[1] > 1.3 * max(predicted, 4.4)
    plt.close(fig)


def _record(scheduler, rid, **change):
    seq = scheduler._requests[rid]
    fields = dict(request_id=rid, prompt=seq.prompt, prompt_token_ids=seq.prompt_token_ids,
                  token_ids=list(seq.output_token_ids), finish_reason=seq.finish_reason, metrics=seq.metrics)
    return FinishedRequest(**{**fields, **change})


def test_pop_response_check_passes_the_solution_and_the_unwritten_stub():
    assert check_pop_response(pop_response).startswith("PASS")

    def unwritten(scheduler, rid):
        raise NotImplementedError

    assert check_pop_response(unwritten).startswith("not written yet")
    assert "own pop_response" in check_pop_response(lambda s, rid: s.pop_response(rid))


def test_pop_response_check_names_the_mistakes():
    def kept(scheduler, rid):  # never forgets
        if not scheduler._requests[rid].is_finished:
            raise ValueError
        return _record(scheduler, rid)

    def live_list(scheduler, rid):  # the request's own list
        seq = scheduler._requests[rid]
        out = pop_response(scheduler, rid)
        return dataclasses.replace(out, token_ids=seq.output_token_ids)

    def unchecked(scheduler, rid):  # pops a running request
        out = _record(scheduler, rid)
        del scheduler._requests[rid]
        return out

    def with_prompt(scheduler, rid):
        out = pop_response(scheduler, rid)
        return dataclasses.replace(out, token_ids=out.prompt_token_ids + out.token_ids)

    def wrong_reason(scheduler, rid):
        return dataclasses.replace(pop_response(scheduler, rid), finish_reason="stop")

    def none_for_unknown(scheduler, rid):
        if rid not in scheduler._requests:
            return None
        return pop_response(scheduler, rid)

    assert "still holds request" in check_pop_response(kept)
    assert "hand out a copy" in check_pop_response(live_list)
    assert "check is_finished first" in check_pop_response(unchecked)
    assert "came with the prompt" in check_pop_response(with_prompt)
    assert "finished with 'length'" in check_pop_response(wrong_reason)
    assert "does not exist, yet it returned None" in check_pop_response(none_for_unknown)
