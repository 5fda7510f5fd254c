"""Notebook 07's exercise: the worker's lookup of a step's streams, under one lock acquisition."""

from __future__ import annotations

from collections.abc import Callable


class _GuardedStreams(dict):
    """check_collect_step_records's `_streams`: remembers every read or change made without the lock held."""

    def __init__(self, lock, items) -> None:
        super().__init__(items)
        self._guard, self.unguarded = lock, 0

    def _seen(self) -> None:
        self.unguarded += not self._guard.locked()

    def __getitem__(self, key):
        self._seen()
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self._seen()
        return super().__contains__(key)

    def get(self, key, default=None):
        self._seen()
        return super().get(key, default)

    def pop(self, key, *default):
        self._seen()
        return super().pop(key, *default)


class _Stream:
    """A stand-in RequestStream: any delivery (`on_token` detokenizes and queues text) is noted, lock held or not."""

    def __init__(self, request_id: int, lock) -> None:
        self.request_id, self._guard, self.deliveries = request_id, lock, []

    def _delivered(self, *args, **kwargs) -> None:
        self.deliveries.append(self._guard.locked())

    on_token = on_finish = fail = _put = _flush = _delivered

    def __repr__(self) -> str:
        return f"<stream of request {self.request_id}>"


def check_collect_step_records(collect: Callable) -> str:
    """Notebook 07: `collect(self, step_tokens, finished)` is SchedulerManager._collect_step_records, the worker's
    lookup after a step. `self._streams` maps a request id to its stream; the handler threads add and drop streams
    under `self._lock`. It must take that lock once for the whole step, return a StepRecord(stream, token, finished)
    for every request with news (a token in `step_tokens`, or in `finished`), pop the finished requests' streams,
    skip requests whose stream a handler already dropped (aborted), and deliver nothing itself: `_deliver`
    detokenizes and hands over, outside the lock, after the lookup.

    The step checked: requests 3, 7 and 11 got tokens, 7 finished with its token, 20 finished without one, 42 is
    running but got no token this step, and 99 (a token) and 55 (finished) were aborted since the step began."""
    import threading
    from types import SimpleNamespace

    from roseinfer.bench.instrument import CountingLock

    lock = CountingLock()
    lock.counted_thread = threading.get_ident()
    live = {rid: _Stream(rid, lock) for rid in (3, 7, 11, 20, 42)}
    streams = _GuardedStreams(lock, live)
    step_tokens, finished = {3: 103, 7: 107, 11: 111, 99: 199}, [7, 20, 55]
    expected = {3: (103, False), 7: (107, True), 11: (111, False), 20: (None, True)}
    try:
        records = collect(SimpleNamespace(_lock=lock, _streams=streams), step_tokens, finished)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your lookup"
    except KeyError as exc:
        rid = exc.args[0] if exc.args else "?"
        return (f"FAIL: KeyError for request {rid}: a handler aborted it after the step began, so its stream is gone; "
                "skip it (`self._streams.get(rid)`, `self._streams.pop(rid, None)`)")
    except Exception as exc:
        return f"FAIL: it raised {type(exc).__name__}: {exc}"
    if lock.locked():
        return "FAIL: the lock is still held after the call: release it (`with self._lock:` does)"
    delivered = [(s.request_id, held) for s in live.values() for held in s.deliveries]
    if delivered:
        rid, held = delivered[0]
        where = "with the lock held, so every handler waits on the text" if held else "itself"
        return (f"FAIL: it delivered request {rid}'s news (on_token detokenizes and queues text) {where}: return "
                "the records; _deliver hands them over after the lookup, outside the lock")
    if lock.count == 0 or streams.unguarded:
        return ("FAIL: it read or changed self._streams without holding self._lock: the handler threads add and "
                "drop streams under that lock")
    if lock.count > 1:
        return (f"FAIL: {lock.count} lock acquisitions for one step of {len(expected)} requests with news: take the "
                "lock once, around the whole loop (one per request is the lock-per-token version)")
    if not isinstance(records, list):
        return f"FAIL: expected a list of StepRecord, got {type(records).__name__}"
    got: dict[int, list[tuple]] = {}
    for record in records:
        stream, token, done = (record if isinstance(record, tuple) else
                               (getattr(record, "stream", None), getattr(record, "token", None),
                                getattr(record, "finished", None)))
        if stream is None:
            return ("FAIL: a record with no stream: a request a handler aborted has none; skip it rather than "
                    "return a record for it")
        got.setdefault(stream.request_id, []).append((token, done))
    for rid, want in expected.items():
        if rid not in got:
            why = (" It finished without a token: look up every request in step_tokens or in finished (their union)"
                   if rid == 20 else "")
            return f"FAIL: request {rid} had news this step and got no record.{why}"
        if len(got[rid]) > 1:
            return f"FAIL: request {rid} got {len(got[rid])} records: look each request up once (the union of ids)"
        if got[rid][0] != want:
            return (f"FAIL: request {rid}'s record says token {got[rid][0][0]}, finished {got[rid][0][1]}; "
                    f"expected token {want[0]}, finished {want[1]}")
    if set(got) - set(expected):
        return f"FAIL: request(s) {sorted(set(got) - set(expected))} had no news this step, yet got a record"
    if {7, 20} & set(streams):
        return (f"FAIL: request(s) {sorted({7, 20} & set(streams))} finished but their streams are still in "
                "self._streams: pop the finished ones")
    if set(streams) != {3, 11, 42}:
        return (f"FAIL: request(s) {sorted({3, 11, 42} - set(streams))} are still running, yet their streams were "
                "removed: pop only the finished")
    return (f"PASS: one lock acquisition for a step of {len(expected)} requests with news; every record right, the "
            "finished streams popped, the aborted skipped, nothing delivered inside the lock")
