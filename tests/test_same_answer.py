"""The manager notebooks' same-answer check: it passes for every variant and catches a token sent astray."""

from __future__ import annotations

import pytest

from roseinfer import history
from roseinfer.bench.same_answer import check_streams
from roseinfer.server.manager import SchedulerManager, StepRecord


def test_every_manager_variant_gives_each_stream_its_own_tokens(engine):
    sentence = check_streams(
        engine, {name: name for name in history.MANAGER_VARIANTS}, num_requests=6, new_tokens=3
    )
    assert "6 requests in flight" in sentence


class CrossedStreams(SchedulerManager):
    """Hands each step's tokens to the streams in a rotated order: the mix-up the check exists for."""

    def _collect_step_records(self, step_tokens, finished):
        records = super()._collect_step_records(step_tokens, finished)
        tokens = [r.token for r in records]
        return [StepRecord(r.stream, t, r.finished) for r, t in zip(records, tokens[1:] + tokens[:1])]


def test_a_token_handed_to_the_wrong_stream_fails_the_check(engine, monkeypatch):
    monkeypatch.setitem(history.MANAGER_VARIANTS, "crossed", CrossedStreams)
    with pytest.raises(AssertionError, match="crossed: request 0 was handed other token ids"):
        check_streams(engine, {"crossed": "crossed"}, num_requests=4, new_tokens=3)
