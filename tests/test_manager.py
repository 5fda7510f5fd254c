"""SchedulerManager and its earlier versions: same tokens, wake-ups, locking, lifecycle."""

from __future__ import annotations

import inspect
import random
import threading
import time

import pytest

from roseinfer import SamplingParams
from roseinfer.bench.instrument import count_worker_locks
from roseinfer.history import MANAGER_VARIANTS, make_manager
from roseinfer.server.manager import SchedulerManager
from roseinfer.server.streams import StreamClosedError

GREEDY = SamplingParams(max_new_tokens=20, stop_on_eos=False)
PROMPTS = [f"Stream {i}: the weather in Paris is" for i in range(12)] + ["東京 🙂", "x"]


@pytest.fixture
def engine(make_engine):
    return make_engine(num_kv_blocks=256)


@pytest.mark.parametrize("variant", sorted(MANAGER_VARIANTS))
def test_every_variant_gives_the_solo_greedy_text(engine, variant):
    expected = [o.text for o in engine.generate(PROMPTS, GREEDY)]
    manager = make_manager(variant, engine, stream_interval=3)
    try:
        streams = [manager.submit(prompt=p, params=GREEDY) for p in PROMPTS]
        texts = ["".join(s.pieces(timeout=60)) for s in streams]
    finally:
        manager.close()
    assert texts == expected
    assert all(s.end.finish_reason == "length" and s.end.completion_tokens == 20 for s in streams)
    assert engine.block_manager.num_used_blocks == 0


def test_stream_interval_flushes_first_piece_then_every_n(engine):
    manager = SchedulerManager(engine, stream_interval=5)
    try:
        stream = manager.submit(
            prompt="Count with me", params=SamplingParams(max_new_tokens=23, stop_on_eos=False)
        )
        pieces = list(stream.pieces(timeout=60))
    finally:
        manager.close()
    assert (
        "".join(pieces)
        == engine.generate(["Count with me"], SamplingParams(max_new_tokens=23, stop_on_eos=False))[0].text
    )
    # Token 1 at once, then tokens 2-6, 7-11, 12-16, 17-21, then the tail (22-23) at the finish.
    assert len(pieces) <= 6
    assert stream.end.completion_tokens == 23


def test_stop_strings_and_eos_through_the_manager(engine):
    full = engine.generate(["Once upon"], GREEDY)[0].text
    stop = full[10:13]
    params = SamplingParams(max_new_tokens=20, stop_on_eos=False, stop=[stop])
    manager = SchedulerManager(engine, stream_interval=2)
    try:
        stream = manager.submit(prompt="Once upon", params=params)
        text = "".join(stream.pieces(timeout=60))
    finally:
        manager.close()
    assert text == full[: full.find(stop)] == engine.generate(["Once upon"], params)[0].text
    assert stream.end.finish_reason == "stop"


def test_idle_worker_sleeps_on_the_event(engine):
    """Idle, the event-driven worker wakes only for work; the polling one wakes all the time."""
    current = SchedulerManager(engine)
    polling = make_manager("polling", engine)
    try:
        time.sleep(0.3)
        assert current.num_idle_wakeups == 0
        assert polling.num_idle_wakeups >= 10  # ~60 naps of 5 ms in 0.3 s
        current.submit(prompt="wake up", params=SamplingParams(max_new_tokens=2)).pieces(timeout=30)
        list(
            current.stream_text(current.add_request(prompt="again", params=SamplingParams(max_new_tokens=2)))
        )
        time.sleep(0.2)
        assert 1 <= current.num_idle_wakeups <= 3
    finally:
        current.close()
        polling.close()


def test_no_lost_wakeup_under_a_stress_of_small_random_intervals(engine):
    """Thousands of tiny requests sent at random instants around the worker's return to idle.

    One producer sends a request, reads it to the end, sleeps a random 0-1 ms and
    sends the next, so each submit lands somewhere in the worker's way from its
    last delivery to its wait. A second producer adds bursts now and then. A
    lost wake-up would leave a request waiting until the next one arrives (and
    the last one forever); the bound catches both.
    """
    manager = SchedulerManager(engine)
    bound_s = 5.0
    waits: list[float] = []
    errors: list[BaseException] = []
    stop_bursts = threading.Event()

    def one(rng: random.Random) -> None:
        start = time.perf_counter()
        stream = manager.submit(
            prompt_token_ids=[rng.randrange(1, 50000)], params=SamplingParams(max_new_tokens=1)
        )
        list(stream.pieces(timeout=bound_s))
        waits.append(time.perf_counter() - start)

    def steady(n: int) -> None:
        rng = random.Random(1)
        try:
            for _ in range(n):
                time.sleep(rng.uniform(0, 0.001))
                one(rng)
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop_bursts.set()

    def bursts() -> None:
        rng = random.Random(2)
        try:
            while not stop_bursts.wait(rng.uniform(0.01, 0.03)):
                threads = [
                    threading.Thread(target=one, args=(random.Random(rng.random()),)) for _ in range(4)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(bound_s * 2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=steady, args=(2000,)), threading.Thread(target=bursts)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        manager.close()
    assert not errors, errors[:1]
    assert len(waits) >= 2000
    assert max(waits) < bound_s
    assert manager.num_idle_wakeups > 500  # the worker really went idle over and over


@pytest.mark.parametrize("batch", [1, 8, 16])
def test_one_lock_acquisition_per_step_vs_one_per_token(engine, batch):
    counts = {}
    for variant in ("current", "lock-per-token"):
        manager = make_manager(variant, engine)
        lock = count_worker_locks(manager)
        try:
            streams = [
                manager.submit(prompt=f"row {i}", params=SamplingParams(max_new_tokens=10, stop_on_eos=False))
                for i in range(batch)
            ]
            time.sleep(0.05)
            for s in streams:
                list(s.pieces(timeout=60))
            steps = manager.stats()["num_steps"]
        finally:
            manager.close()
        counts[variant] = lock.count / steps
    # The current worker: once to take new work, once to look up the step's streams.
    assert counts["current"] <= 2.5
    assert counts["lock-per-token"] >= batch * 0.8


def test_manager_uses_only_the_schedulers_public_methods():
    source = inspect.getsource(inspect.getmodule(SchedulerManager))
    assert "._scheduler._" not in source
    private = inspect.getsource(MANAGER_VARIANTS["private-state"])
    assert "._scheduler._requests" in private  # the "before" of notebook 06 really is different


def test_close_ends_open_streams_and_refuses_new_work(engine):
    from roseinfer.server.manager import EngineDeadError

    manager = SchedulerManager(engine)
    stream = manager.submit(prompt="long", params=SamplingParams(max_new_tokens=200, stop_on_eos=False))
    pieces = stream.pieces(timeout=30)
    next(pieces)
    manager.close()
    with pytest.raises(StreamClosedError, match="shutting down"):
        list(pieces)
    assert not manager.healthy
    with pytest.raises(EngineDeadError):
        manager.submit(prompt="late")


def test_abort_frees_blocks(engine):
    manager = SchedulerManager(engine)
    try:
        streams = [
            manager.submit(
                prompt=f"abort me {i}", params=SamplingParams(max_new_tokens=200, stop_on_eos=False)
            )
            for i in range(4)
        ]
        next(streams[0].pieces(timeout=30))
        for s in streams:
            manager.abort(s.request_id)
        deadline = time.monotonic() + 10
        while manager.stats()["used_blocks"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert manager.stats()["used_blocks"] == 0
        assert manager.stats()["inflight_requests"] == 0
    finally:
        manager.close()


def test_invalid_requests_are_refused_in_the_callers_thread(engine):
    from roseinfer import InvalidRequestError

    manager = SchedulerManager(engine, max_inflight_requests=1)
    try:
        with pytest.raises(InvalidRequestError, match="context"):
            manager.submit(prompt_token_ids=[1] * 250, params=SamplingParams(max_new_tokens=50))
        assert manager.stats()["inflight_requests"] == 0
    finally:
        manager.close()


def test_tokenize_workers_tokenize_off_the_callers_thread(engine, monkeypatch):
    expected = [o.text for o in engine.generate(PROMPTS, GREEDY)]
    manager = SchedulerManager(engine, tokenize_workers=2)
    tokenizing_threads = []
    validate = engine.validate

    def recording_validate(*args):
        tokenizing_threads.append(threading.current_thread().name)
        return validate(*args)

    monkeypatch.setattr(engine, "validate", recording_validate)
    try:
        streams = [manager.submit(prompt=p, params=GREEDY) for p in PROMPTS]
        texts = ["".join(s.pieces(timeout=60)) for s in streams]
        # An invalid prompt is found in the pool, so its stream ends with the error.
        bad = manager.submit(prompt="", params=GREEDY)
        with pytest.raises(StreamClosedError, match="empty"):
            list(bad.pieces(timeout=60))
    finally:
        manager.close()
    assert texts == expected
    # Validated once a request, in the pool: never by the caller, never again by the worker.
    assert len(tokenizing_threads) == len(PROMPTS) + 1
    assert all(n.startswith("roseinfer-tokenize") for n in tokenizing_threads)
    assert all(s.timings.submit <= s.timings.tokenized <= s.timings.queued for s in streams)
    assert manager.stats()["inflight_requests"] == 0
