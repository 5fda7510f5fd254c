"""Checks for the notebooks' write-the-code exercises: each runs the reader's function against a small test and
prints one line, PASS or what failed. The solutions live in `roseinfer.bench.solutions`, out of the notebook."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

ROUTER_REPLICAS = ["http://replica-1", "http://replica-2"]


def check_kv_cache_attention(step: Callable) -> str:
    """Notebook 01: `step(cache, x, project, scale)` gets one new token's hidden state x ([E]), a `project`
    that maps rows [n, E] to their (q, k, v), each [n, D], and a `cache` dict (empty at first, kept across
    calls). It must return that token's attention output over every token so far, itself included, and
    project each token once: the keys and values of earlier tokens come from the cache, not recomputed."""
    import torch

    gen = torch.Generator().manual_seed(0)
    tokens, width, dim, scale = 6, 12, 8, 8**-0.5
    xs = torch.randn(tokens, width, generator=gen)
    weights = torch.randn(3, width, dim, generator=gen)
    projected = []

    def project(rows):
        if rows.dim() != 2 or rows.shape[1] != width:
            raise ValueError(f"project takes rows [n, {width}], got {tuple(rows.shape)}")
        projected.append(rows.shape[0])
        return rows @ weights[0], rows @ weights[1], rows @ weights[2]

    q, k, v = (xs @ w for w in weights)
    causal = torch.full((tokens, tokens), float("-inf")).triu(1)
    expected = torch.softmax(q @ k.T * scale + causal, dim=-1) @ v  # row t: token t over tokens 0..t
    cache: dict = {}
    try:
        outs = [step(cache, xs[t], project, scale) for t in range(tokens)]
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your step"
    for t, out in enumerate(outs):
        out = out.reshape(-1) if isinstance(out, torch.Tensor) and out.numel() == dim else out
        if not isinstance(out, torch.Tensor) or out.shape != (dim,):
            return f"FAIL: token {t}: expected a tensor of {dim} values, got {getattr(out, 'shape', type(out))}"
        if not torch.allclose(out, expected[t], atol=1e-5):
            alone = torch.allclose(out, v[t], atol=1e-5)
            hint = " (it attended to the new token alone: keep every token's k and v)" if alone else ""
            return f"FAIL: token {t} is off by {(out - expected[t]).abs().max():.3g} from causal attention{hint}"
    if sum(projected) != tokens:
        return (f"FAIL: right answers, but {sum(projected)} rows projected for {tokens} tokens: earlier tokens' "
                "keys and values were recomputed instead of read from the cache")
    return f"PASS: {tokens} tokens, each projected once, each attending to every cached key and value and itself"


def check_prefix_router(route: Callable[[str, list[str]], str]) -> str:
    """Notebook 14: `route(prompt, replicas)` must send prompts with the same system prompt (the text before
    "\\nUser:") to the same replica, and spread distinct system prompts over the replicas."""
    systems = [f"System {i}: you answer for shop number {i}." for i in range(16)]
    try:
        chosen = {s: {route(f"{s}\nUser: question {u}?", ROUTER_REPLICAS) for u in range(5)} for s in systems}
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your router"
    if any(len(replicas) > 1 for replicas in chosen.values()):
        return "FAIL: one system prompt went to several replicas (its cached blocks are wasted on all but one)"
    spread = Counter(next(iter(r)) for r in chosen.values())
    if set(spread) - set(ROUTER_REPLICAS):
        return f"FAIL: it answered a replica it was not given: {sorted(set(spread) - set(ROUTER_REPLICAS))}"
    if min(spread.get(r, 0) for r in ROUTER_REPLICAS) < 4:
        return f"FAIL: 16 system prompts split {dict(spread)}: one replica would do all the work"
    return f"PASS: each system prompt sticks to one replica, 16 of them split {sorted(spread.values())}"


def check_gqa_decode(attend: Callable) -> str:
    """Notebook 12: `attend(q, k, v, scale)` with q [heads, D] (one decode token) and k, v [tokens, kv_heads, D]
    must give [heads, D], query head h reading KV head h // (heads // kv_heads), as transformers lays them out."""
    import torch

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, tokens = 9, 3, 8, 5
    q = torch.randn(heads, dim, generator=gen)
    k, v = torch.randn(tokens, kv_heads, dim, generator=gen), torch.randn(tokens, kv_heads, dim, generator=gen)
    group = heads // kv_heads
    expected = torch.stack([torch.softmax(k[:, h // group] @ q[h] * 0.5, 0) @ v[:, h // group] for h in range(heads)])
    interleaved = torch.stack([torch.softmax(k[:, h % kv_heads] @ q[h] * 0.5, 0) @ v[:, h % kv_heads]
                               for h in range(heads)])
    try:
        out = attend(q, k, v, 0.5)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your attention"
    if not isinstance(out, torch.Tensor) or out.shape != (heads, dim):
        return f"FAIL: expected a tensor of shape {(heads, dim)}, got {getattr(out, 'shape', type(out))}"
    if torch.allclose(out, interleaved, atol=1e-5):
        return "FAIL: query head h read KV head h % kv_heads; the heads of a group are consecutive: h // group"
    if not torch.allclose(out, expected, atol=1e-5):
        return f"FAIL: off by {(out - expected).abs().max():.3g} from the reference"
    return f"PASS: {heads} query heads on {kv_heads} KV heads, each reading its group's keys and values"


class _CalledTheAccessor(Exception):
    """Raised by check_generated_ids's scheduler when an answer calls the accessor it was asked to write."""


def check_generated_ids(get_ids: Callable) -> str:
    """Notebook 06: `get_ids(scheduler, request_id)` is the scheduler's `get_generated_ids`, written from outside.
    It must return that request's generated token ids (its output, not its prompt) as a list the caller owns:
    appending to it leaves the scheduler's request alone, a later call sees the tokens generated since, and an
    unknown id raises KeyError, as the scheduler's own accessors do.

    The scheduler here runs without a model (the check samples each request's tokens itself: 100, 101, ... for
    one request, 200, 201, ... for the other), and has no `get_generated_ids` of its own to call."""
    try:
        return _check_generated_ids(get_ids)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your accessor"
    except _CalledTheAccessor:
        return ("FAIL: it called the scheduler's own get_generated_ids: write that method's body, reading the "
                "request from scheduler._requests")


def _check_generated_ids(get_ids: Callable) -> str:
    from roseinfer.config import SchedulerLimits
    from roseinfer.engine.block_manager import BlockManager
    from roseinfer.engine.scheduler import OnlineScheduler
    from roseinfer.engine.sequence import Request
    from roseinfer.sampling import SamplingParams

    class Scheduler(OnlineScheduler):  # the accessor being written is not there to call
        def get_generated_ids(self, request_id: int) -> list[int]:
            raise _CalledTheAccessor

    scheduler = Scheduler(BlockManager(16, 4), SchedulerLimits(enable_prefix_cache=False), frozenset())
    params = SamplingParams(max_new_tokens=8, stop_on_eos=False)
    a, b, unknown = 7, 3, 5  # ids that are not positions: a list index in place of a lookup shows
    prompts = {a: [1, 2, 3], b: [4, 5, 6, 7, 8]}
    for rid, prompt in prompts.items():
        scheduler.add_request(Request(prompt, params), request_id=rid)
    base, made = {a: 100, b: 200}, {a: [], b: []}  # made: every token the stand-in model sampled, per request

    def step() -> None:  # engine.step with a stand-in for the model
        batch = scheduler.schedule()
        sampled = [base[seq.request_id] + len(made[seq.request_id]) if entry.sample else None
                   for (seq, _), entry in zip(batch.scheduled, batch.entries)]
        for (seq, _), token in zip(batch.scheduled, sampled):
            if token is not None:
                made[seq.request_id].append(token)
        scheduler.update(batch, sampled)

    for _ in range(3):
        step()
    got = {rid: get_ids(scheduler, rid) for rid in (a, b)}
    for rid, other in ((a, b), (b, a)):
        ids = got[rid]
        if not isinstance(ids, list):
            return f"FAIL: expected a list of token ids, as the scheduler's accessor gives, got {type(ids).__name__}"
        if ids == made[other]:
            return (f"FAIL: asked for request {rid}, it returned request {other}'s tokens: look the request up by "
                    "its id")
        if ids == prompts[rid] + made[rid]:
            return f"FAIL: request {rid}'s ids came with its prompt: the generated ids are its output alone"
        if ids == prompts[rid]:
            return f"FAIL: request {rid}'s prompt came back: the generated ids are its output_token_ids"
        if ids != made[rid]:
            return f"FAIL: request {rid} generated {made[rid]}, it returned {ids}"
    got[b].append(-1)  # the caller's own bookkeeping, on the list it was given
    if scheduler._requests[b].output_token_ids != made[b]:
        return ("FAIL: appending to the returned list changed the scheduler's request: that list is the request's "
                "own; return a copy")
    step()
    again = get_ids(scheduler, b)
    if again != made[b]:
        return (f"FAIL: after one more step it returned {again}, where request {b} has generated {made[b]}: read "
                "the request at each call")
    try:
        stray = get_ids(scheduler, unknown)
    except KeyError:
        return ("PASS: each request's own generated ids, in a list the caller may change without touching the "
                "scheduler, read afresh at each call; an unknown id raises KeyError")
    except (NotImplementedError, _CalledTheAccessor):
        raise
    except Exception as exc:
        return f"FAIL: an unknown request id raised {type(exc).__name__}; the scheduler's accessors raise KeyError"
    return (f"FAIL: request {unknown} does not exist, yet it returned {stray!r}: raise KeyError, as the scheduler's "
            "accessors do, so that a wrong id is an error and not an answer")


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


def check_graph_bucket(choose: Callable) -> str:
    """Notebook 09: `choose(buckets, batch)` picks the captured graph a decode step of `batch` rows replays, as
    DecodeGraphs.bucket_for does: the smallest bucket that holds every row, and how many padding rows fill it,
    as (bucket, padded rows); None where the batch is larger than every bucket (that step runs eagerly).
    `buckets` are sorted, as graph_buckets gives them."""
    from roseinfer.engine.cuda_graphs import graph_buckets

    try:
        for largest in (64, 16, 5):
            buckets = graph_buckets(largest)
            for batch in range(1, largest + 2):
                verdict = _check_bucket(choose, list(buckets), batch)
                if verdict:
                    return verdict
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your choice"
    return ("PASS: every batch goes to the smallest captured graph that holds it, padded to its size; a batch "
            "larger than every graph runs eagerly")


def _check_bucket(choose: Callable, buckets: list[int], batch: int) -> str | None:
    fits = [b for b in buckets if b >= batch]
    expected = (fits[0], fits[0] - batch) if fits else None
    try:
        got = choose(buckets, batch)
    except NotImplementedError:
        raise
    except Exception as exc:
        if expected is None:
            return (f"FAIL: a batch of {batch}, larger than every graph ({buckets[-1]} rows), raised "
                    f"{type(exc).__name__}: return None, and the step runs eagerly")
        return f"FAIL: buckets {buckets}, a batch of {batch}: it raised {type(exc).__name__}: {exc}"
    if got == expected:
        return None
    if expected is None:
        return (f"FAIL: a batch of {batch} is larger than every graph ({buckets[-1]} rows), yet it returned "
                f"{got!r}: no graph holds its rows; return None, and the step runs eagerly")
    if not (isinstance(got, tuple) and len(got) == 2):
        return f"FAIL: a batch of {batch}: expected (bucket, padded rows), got {got!r}"
    bucket, padded = got
    if bucket not in buckets:
        return f"FAIL: a batch of {batch} went to {bucket!r}, which is not a captured size ({buckets})"
    if bucket < batch:
        return (f"FAIL: a batch of {batch} went to the graph of {bucket} rows: a replay computes exactly the rows "
                "it captured, so rows would be lost; take the smallest bucket that holds the batch")
    if bucket > expected[0]:
        exact = " exactly" if expected[1] == 0 else ""
        return (f"FAIL: a batch of {batch} went to the graph of {bucket} rows where the {expected[0]}-row graph "
                f"holds it{exact}: every padding row is computed and thrown away; take the smallest that holds it")
    return (f"FAIL: a batch of {batch} in the {bucket}-row graph leaves {expected[1]} padding rows (the bucket's "
            f"rows less the batch's), not {padded!r}")


def _paged_reference(q, k_cache, v_cache, table, context_len: int, scale: float):
    """One sequence's decode attention by the gather + SDPA path (notebook 08's "before")."""
    import torch

    from roseinfer.attention.base import AttentionMetadata
    from roseinfer.bench.paged_attention import gather_attention

    meta = AttentionMetadata(slot_mapping=torch.full((1,), -1), block_tables=table[None],
                             context_lens=torch.tensor([context_len], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, 1], dtype=torch.int32), max_query_len=1,
                             max_context_len=context_len)
    return gather_attention(q[None], k_cache, v_cache, meta, scale)[0]


def _paged_weights(scores, block_size: int, rescale: bool = True, normalize: bool = True):
    """Softmax weights of each head's scores [H, n], accumulated a block at a time as an online softmax does; with
    rescale=False, the mistake of never rescaling what earlier blocks added when the maximum grows."""
    import torch

    heads, n = scores.shape
    running = torch.full((heads,), float("-inf"), dtype=scores.dtype)
    weights = torch.zeros_like(scores)
    total = torch.zeros(heads, dtype=scores.dtype)
    for start in range(0, n, block_size):
        block = scores[:, start:start + block_size]
        new = torch.maximum(running, block.max(dim=1).values)
        if rescale:
            weights *= torch.exp(running - new)[:, None]
            total *= torch.exp(running - new)
        weights[:, start:start + block_size] = torch.exp(block - new[:, None])
        total += weights[:, start:start + block_size].sum(dim=1)
        running = new
    return weights / total[:, None] if normalize else weights


def _call_paged(attend, case) -> tuple:
    """(output as float32, None) or (None, the FAIL line) for one call of the reader's function."""
    import torch

    q, k_cache, v_cache, table, context_len, scale = case
    try:
        out = attend(q, k_cache, v_cache, table, context_len, scale)
    except NotImplementedError:
        raise
    except IndexError as exc:
        return None, (f"FAIL: IndexError ({exc}): an index past a block or past the table. Token t of the sequence "
                      "lies in block block_table[t // block_size], slot t % block_size")
    except Exception as exc:
        return None, f"FAIL: it raised {type(exc).__name__}: {exc}"
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
        got = getattr(out, "shape", type(out))
        return None, f"FAIL: expected a tensor of shape {tuple(q.shape)} ([H, D]), got {got}"
    return out.float(), None


def _paged_probe(attend) -> str | None:
    """Values that say which slot they came from: V of slot j is the j-th unit vector (the same for every head), so
    out[h, j] is the weight head h gave slot j. The keys make each head's scores rise token by token (the maximum
    grows from block to block), and the table has one entry more than the context needs."""
    import torch

    heads, block_size, num_blocks, table, n = 3, 4, 8, [5, 2, 6, 0], 10
    dim = num_blocks * block_size
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(heads, dim, generator=gen)
    k_cache = torch.randn(num_blocks, block_size, heads, dim, generator=gen)
    slots = [table[t // block_size] * block_size + t % block_size for t in range(n)]  # token t's slot
    for t, slot in enumerate(slots):  # score of token t rises by about 0.35 t
        k_cache.view(-1, heads, dim)[slot] += 2.0 * t * q / (q * q).sum(dim=1, keepdim=True)
    v_cache = torch.eye(dim).view(num_blocks, block_size, 1, dim).expand(-1, -1, heads, -1).contiguous()
    scale = dim**-0.5
    out, fail = _call_paged(attend, (q, k_cache, v_cache, torch.tensor(table, dtype=torch.int32), n, scale))
    if fail:
        return fail
    if not torch.isfinite(out).all():
        return ("FAIL: NaN or inf in the output, with scores of a few units: look at the first block (with the "
                "running maximum at -inf, exp(-inf - m) is 0 but -inf - (-inf) is NaN) and at the final division")
    keys = k_cache.view(-1, heads, dim)[slots]  # [n, H, D]: the context's keys, token by token
    owned = torch.zeros(dim, dtype=torch.bool)
    owned[slots] = True
    stray = out[:, ~owned].abs().sum(dim=1).max().item()
    if stray > 1e-3:
        last = table[(n - 1) // block_size] * block_size
        beyond = set(range(last + n % block_size, last + block_size)) if n % block_size else set()
        beyond |= {b * block_size + s for b in table[-(-n // block_size):] for s in range(block_size)}
        read = {j for j in range(dim) if not owned[j] and out[:, j].abs().max() > 1e-4}
        if read <= beyond and bool((out[:, slots].abs() > 1e-6).all()):  # every token read, and more
            return (f"FAIL: with context_len {n} and blocks of {block_size}, it read slots past the context (the end "
                    f"of the last block, or table entries after it): read {-(-n // block_size)} blocks, and only "
                    f"{n - (-(-n // block_size) - 1) * block_size} tokens of the last")
        if {j for j in range(dim) if out[:, j].abs().max() > 1e-4} == set(range(n)):  # token t from slot t
            return ("FAIL: it read blocks 0, 1, 2, ... of the cache, not the sequence's: the physical block of token "
                    "t is block_table[t // block_size]")
        return (f"FAIL: it read slots that hold none of this sequence's tokens (weight {stray:.2f} on them): wrong "
                "block/slot arithmetic; token t lies in block block_table[t // block_size], slot t % block_size")
    weights = out[:, slots]  # [H, n]
    own = torch.einsum("hd,nhd->hn", q, keys) * scale
    if torch.allclose(weights, _paged_weights(own, block_size), atol=1e-4):
        return None
    tail = n % block_size
    if tail and weights[:, -tail:].abs().max() < 1e-6:
        return (f"FAIL: the last {tail} tokens got no weight: the last block is only partly full; read "
                "ceil(context_len / block_size) blocks")
    sums = out.sum(dim=1)
    if (sums - 1).abs().max() > 1e-3:
        return (f"FAIL: each head's weights sum to {sums.tolist()[0]:.3g}, not 1: divide the accumulator by the "
                "running sum of the exponentials at the end")
    for h in range(heads):
        for g in range(heads):
            other = _paged_weights(torch.einsum("d,nd->n", q[h], keys[:, g])[None] * scale, block_size)[0]
            if g != h and torch.allclose(weights[h], other, atol=1e-4):
                return (f"FAIL: mixing up heads: query head {h} scored head {g}'s keys; head h reads "
                        "k_cache[block, slot, h] only")
    summed = _paged_weights(torch.einsum("hd,nhd->n", q, keys)[None] * scale, block_size)
    if torch.allclose(weights, summed.expand(heads, -1), atol=1e-4):
        return ("FAIL: mixing up heads: every head got the same weights, its scores summed over all heads; each head "
                "scores its own query against its own keys")
    for wrong, why in ((1.0, "without the scale"), (scale**2, "with the scale applied twice")):
        if torch.allclose(weights, _paged_weights(own / scale * wrong, block_size), atol=1e-4):
            return f"FAIL: the scores were taken {why}: softmax(q . k x scale), the scale once"
    if torch.allclose(weights, _paged_weights(own, block_size, rescale=False), atol=1e-4) or torch.allclose(
            weights, _paged_weights(own, 1, rescale=False), atol=1e-4):
        return ("FAIL: what earlier tokens added was not rescaled when the running maximum grew: multiply the running "
                "sum and the accumulator by exp(old max - new max) before adding the new block")
    off = (weights - _paged_weights(own, block_size)).abs().max()
    return f"FAIL: each slot was read right, but the weights are off by {off:.3g} from the softmax of q . k x scale"


def check_paged_decode(attend: Callable) -> str:
    """Notebook 08: `attend(q, k_cache, v_cache, block_table, context_len, scale)` is one sequence's decode attention
    read through its block table: q [H, D]; caches [num_blocks, block_size, H, D]; block_table a 1-D int tensor whose
    entry j is the physical block of the sequence's tokens j * block_size .. (j + 1) * block_size - 1 (it may have
    entries past the context: ignore them); context_len the tokens cached. It must return [H, D]: each head's query
    over its own head's keys and values of tokens 0 .. context_len - 1, as the gather + SDPA path gives.

    Three checks: a probe whose values say which slots were read and with what weight (block and slot arithmetic,
    the context's end, heads, the softmax); random caches with poison in every slot the sequence does not own, at
    contexts of 1, one block, two and 13 tokens; a score of 2000 (exp overflows without the maximum subtracted, even
    in float64). It cannot tell an online softmax from one taken over all the scores at once: that part is yours."""
    import torch

    try:
        fail = _paged_probe(attend)
        if fail:
            return fail
        heads, dim, block_size = 4, 8, 4
        gen = torch.Generator().manual_seed(1)
        for n in (1, block_size, 2 * block_size, 13):
            table = torch.randperm(12, generator=gen)[: -(-n // block_size) + 2].to(torch.int32)  # 2 spare entries
            k_cache, v_cache = (torch.randn(12, block_size, heads, dim, generator=gen) for _ in range(2))
            owned = torch.zeros(12, block_size, dtype=torch.bool)
            for t in range(n):
                owned[table[t // block_size], t % block_size] = True
            k_cache[~owned] = 1e4  # poison: a slot read that no token owns wrecks the answer
            v_cache[~owned] = 1e4
            case = (torch.randn(heads, dim, generator=gen), k_cache, v_cache, table, n, dim**-0.5)
            out, fail = _call_paged(attend, case)
            if fail:
                return fail
            expected = _paged_reference(*case)
            if torch.allclose(out, expected, atol=1e-4):
                continue
            q = case[0]
            keys, values = (c.view(-1, heads, dim)[[int(table[t // block_size]) * block_size + t % block_size
                                                     for t in range(n)]] for c in (k_cache, v_cache))
            for h in range(heads):
                for g in range(heads):
                    w = torch.softmax(keys[:, h] @ q[h] * dim**-0.5, dim=0)
                    if g != h and torch.allclose(out[h], w @ values[:, g], atol=1e-4):
                        return (f"FAIL: mixing up heads: head {h}'s weights were applied to head {g}'s values; head h "
                                "reads v_cache[block, slot, h]")
                    w = torch.softmax(keys[:, g] @ q[h] * dim**-0.5, dim=0)
                    if g != h and torch.allclose(out[h], w @ values[:, g], atol=1e-4):
                        return (f"FAIL: mixing up heads: query head {h} read head {g}'s keys and values; head h "
                                "reads k_cache[block, slot, h] and v_cache[block, slot, h]")
            return (f"FAIL: context_len {n} (blocks of {block_size}): off by {(out - expected).abs().max():.3g} from "
                    "the gather + SDPA reference")
        heads, dim = 2, 8
        q, k_cache = torch.randn(heads, dim, generator=gen) * 10, torch.randn(6, block_size, heads, dim, generator=gen)
        v_cache, table, scale = torch.randn(6, block_size, heads, dim, generator=gen), [3, 1, 4], dim**-0.5
        k_cache[1, 2] = q * (2000 / scale) / (q * q).sum(dim=1, keepdim=True)  # token 6's score: 2000, every head
        case = (q, k_cache, v_cache, torch.tensor(table, dtype=torch.int32), 11, scale)
        out, fail = _call_paged(attend, case)
        if fail:
            return fail
        if not torch.isfinite(out).all():
            return ("FAIL: overflow: with a score of 2000, exp(score) is inf (in float64 too) and the output NaN: "
                    "subtract each head's running maximum before exp, and rescale when it grows")
        if not torch.allclose(out, _paged_reference(*case), atol=1e-4):
            return (f"FAIL: with a score of 2000 among scores of about 10 the output is off by "
                    f"{(out - _paged_reference(*case)).abs().max():.3g} (it should be that token's value)")
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your attention"
    return ("PASS: every token read through the block table, nothing past the context, each head on its own keys and "
            "values, no overflow at a score of 2000; equal to the gather + SDPA reference")


SSE_BASE = {"id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "gpt2"}
SSE_PIECES = ["Hello", ",", " new\nline", " caf\u00e9"]


def check_frame_stream(frame: Callable) -> str:
    """Notebook 13: `frame(base, pieces, finish_reason)` must return the body of one streamed completion, as the
    server sends it: a `data: <chunk JSON>` event per piece, one chunk with the finish reason, then `data: [DONE]`."""
    import json

    try:
        out = frame(dict(SSE_BASE), list(SSE_PIECES), "length")
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your framing"
    if not isinstance(out, str):
        return f"FAIL: return the whole body as one str (got {type(out).__name__})"
    if "new\nline" in out:
        return ("FAIL: a raw newline inside an event: the piece ' new\\nline' was written as it is, and a newline "
                "ends the event's line; json.dumps the chunk (it writes the newline as \\n)")
    if not out.endswith("\n\n") or any("\n" in e for e in out.split("\n\n")):
        return ("FAIL: each event ends with a blank line ('\\n\\n'): without it the client reads the next event as "
                "part of this one")
    events = out.split("\n\n")[:-1]
    if not all(e.startswith("data: ") for e in events):
        return "FAIL: every event is one line starting with 'data: ' (then the JSON, or [DONE])"
    payloads = [e.removeprefix("data: ") for e in events]
    if payloads[-1] == '"[DONE]"':
        return "FAIL: [DONE] is sent as it is, `data: [DONE]`, not as a JSON string"
    if payloads[-1] != "[DONE]":
        return "FAIL: the stream must end with `data: [DONE]`, OpenAI's end-of-stream marker"
    try:
        chunks = [json.loads(p) for p in payloads[:-1]]
    except json.JSONDecodeError as exc:
        return f"FAIL: an event's data is not JSON ({exc}): json.dumps each chunk"
    if len(chunks) == len(SSE_PIECES):
        return ("FAIL: no chunk of its own carries the finish reason: after the pieces, send one more chunk with "
                "text '' and finish_reason")
    if len(chunks) != len(SSE_PIECES) + 1:
        return f"FAIL: {len(chunks)} chunks for {len(SSE_PIECES)} pieces (expected one a piece, then one to finish)"
    if not all(isinstance(c, dict) and all(c.get(k) == v for k, v in SSE_BASE.items()) for c in chunks):
        return "FAIL: every chunk carries the envelope (`base`: id, object, created, model), not only the first"
    try:
        choices = [c["choices"][0] for c in chunks]
        texts = [ch["text"] for ch in choices]
        reasons = [ch["finish_reason"] for ch in choices]
    except (KeyError, IndexError, TypeError):
        return "FAIL: each chunk needs choices: [{index, text, logprobs, finish_reason}]"
    if texts[:-1] != SSE_PIECES or texts[-1] != "":
        return f"FAIL: the chunks' texts are {texts}: expected each piece unchanged, then ''"
    if any(r is not None for r in reasons[:-1]):
        return "FAIL: finish_reason is null on the pieces' chunks, set only on the last"
    if reasons[-1] != "length":
        return f"FAIL: the last chunk's finish_reason is {reasons[-1]!r}, expected the one passed in, 'length'"
    if any(ch.get("index") != 0 for ch in choices):
        return "FAIL: a single completion's choices all have index 0"
    return ("PASS: one `data:` event a piece (a newline in a piece JSON-escaped), a chunk with the finish reason, "
            "the envelope on every chunk, then `data: [DONE]`; a blank line after each event")


PACK_CASES = (  # (new token ids, start_pos) per sequence; a sequence's ids name it: 11, 12 ... are sequence 1's
    ("prefills of 5, 2 and 3 tokens", [([11, 12, 13, 14, 15], 0), ([21, 22], 0), ([31, 32, 33], 0)]),
    ("decodes at 7, 3 and 12 cached tokens", [([17], 7), ([23], 3), ([34], 12)]),
    ("a prefill of 4, a decode at 9, a prefill of 3, a decode at 5",
     [([11, 12, 13, 14], 0), ([29], 9), ([31, 32, 33], 0), ([45], 5)]),
)
PACK_FIELDS = ("input_ids", "positions", "query_start_loc", "context_lens", "last_rows")


def _pack_engine(seqs) -> dict[str, list[int]]:
    """What the engine's ModelRunner.prepare builds for these sequences. prepare reads only the runner's block size
    and device, so a stand-in runner serves (no model, no KV cache)."""
    from types import SimpleNamespace

    import torch

    from roseinfer.engine.batch import BatchEntry
    from roseinfer.engine.runner import ModelRunner

    runner = SimpleNamespace(block_size=4, device=torch.device("cpu"))
    entries = [BatchEntry(list(ids), start, list(range(8)), True, None, None) for ids, start in seqs]
    input_ids, positions, meta, sample_rows = ModelRunner.prepare(runner, entries)
    return {"input_ids": input_ids.tolist(), "positions": positions.tolist(),
            "query_start_loc": meta.query_start_loc.tolist(), "context_lens": meta.context_lens.tolist(),
            "last_rows": sample_rows.tolist()}


def _pack_mistake(name: str, got: list[int], seqs, want: dict[str, list[int]]) -> str:
    """Names the mistake behind a wrong `name` field, given the right ones."""
    import itertools

    lens = [len(ids) for ids, _ in seqs]
    starts = [start for _, start in seqs]
    offsets = want["query_start_loc"]
    if name == "input_ids":
        if len(got) == len(seqs) * max(lens):
            return (f"padded: {len(got)} ids for {sum(lens)} new tokens, every sequence filled up to the longest; a "
                    "packed batch has no padding: the sequences' tokens one after another")
        if sorted(got) == sorted(want["input_ids"]) and any(
                got == [t for j in order for t in seqs[j][0]] for order in itertools.permutations(range(len(seqs)))):
            return ("sequences reordered: keep the batch's order (the runner hands the i-th sampled token back to the "
                    "i-th entry)")
        return "expected every sequence's new tokens, one sequence after another, in the batch's order"
    if name == "positions":
        if got == [p for n in lens for p in range(n)]:
            return ("positions restart at 0 in every sequence: a token's position counts the tokens already cached, "
                    "start_pos, start_pos + 1, ...; a decode token at 0 is read as its sequence's first token")
        if got == list(range(sum(lens))):
            return "positions run on across sequences: each sequence counts from its own start_pos"
        if got == [s + 1 + p for s, n in zip(starts, lens) for p in range(n)]:
            return ("off by one: the first new token's position is start_pos (the number of tokens before it), not "
                    "start_pos + 1")
        return "expected start_pos, start_pos + 1, ... for each sequence's new tokens"
    if name == "query_start_loc":
        if got in (offsets[1:], offsets[:-1]):
            return (f"{len(got)} offsets for {len(seqs)} sequences: there are B + 1, from 0 to the number of tokens, "
                    "so that sequence i's tokens are input_ids[query_start_loc[i]:query_start_loc[i + 1]]")
        if got == lens:
            return "these are the sequences' lengths: the offsets are their running sum, starting at 0"
        if got in ([o - 1 for o in offsets], [o + 1 for o in offsets], [0] + [o - 1 for o in offsets[1:]]):
            return "offsets off by one: query_start_loc[i + 1] - query_start_loc[i] must be sequence i's new tokens"
        return "expected 0, then the running sum of the sequences' new-token counts"
    if name == "context_lens":
        if got == lens:
            return ("the new tokens only: a sequence also attends to the tokens already in its cache, start_pos + its "
                    "new tokens")
        if got == starts:
            return ("the cache before this step: each new token's key joins the cache and is attended to too, "
                    "start_pos + its new tokens")
        if got in ([s + n - 1 for s, n in zip(starts, lens)], [s + n + 1 for s, n in zip(starts, lens)]):
            return "off by one: a sequence attends to start_pos + its new tokens, itself included"
        return "expected start_pos + the new tokens, per sequence"
    if got == offsets[:-1]:
        return ("sampled the first token of each sequence: a prompt's next token comes from the logits of its last "
                "token, query_start_loc[i + 1] - 1")
    if got == [n - 1 for n in lens]:
        return ("indices within each sequence: the logits are computed for the packed rows, so the last token of "
                "sequence i is row query_start_loc[i + 1] - 1")
    if got == offsets[1:]:
        return ("off by one: query_start_loc[i + 1] is the next sequence's first token; sequence i's last is "
                "query_start_loc[i + 1] - 1")
    return "expected the packed row of each sequence's last new token"


def _pack_ints(value) -> list[int] | None:
    """A flat sequence of ints (a list, a tensor, an array) as a list; None if it is not one."""
    value = value.tolist() if hasattr(value, "tolist") else value
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):  # not iterable, or nested (one row per sequence)
        return None


def check_pack_batch(pack: Callable) -> str:
    """Notebook 02: `pack(seqs)` is the heart of ModelRunner.prepare. `seqs` lists each sequence of a step as
    (token_ids, start_pos): the new tokens it computes now and how many of its tokens the KV cache holds already (0
    for a prompt; for a decode, the tokens so far). It must return five flat sequences of ints,
    (input_ids, positions, query_start_loc, context_lens, last_rows):

    - input_ids: every sequence's new tokens, one sequence after another, in the given order (packed, not padded);
    - positions: each token's position in its own sequence: start_pos, start_pos + 1, ...;
    - query_start_loc: B + 1 offsets: sequence i's tokens are input_ids[query_start_loc[i]:query_start_loc[i + 1]];
    - context_lens: how many tokens each sequence attends to after this step (cached + new);
    - last_rows: the row in input_ids of each sequence's last new token, whose logits are sampled.

    Compared with what ModelRunner.prepare builds for prefills of different lengths, decodes, and a mix of both."""
    for what, seqs in PACK_CASES:
        try:
            out = pack([(list(ids), start) for ids, start in seqs])
        except NotImplementedError:
            return "not written yet: replace the `raise NotImplementedError` with your packing"
        except Exception as exc:
            return f"FAIL: on {what} it raised {type(exc).__name__}: {exc}"
        if not isinstance(out, (tuple, list)) or len(out) != len(PACK_FIELDS):
            got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
            return f"FAIL: expected a tuple of five, ({', '.join(PACK_FIELDS)}), got {got}"
        want = _pack_engine(seqs)
        for name, value in zip(PACK_FIELDS, out):
            got = _pack_ints(value)
            if got is None:
                nested = " (one row per sequence is padding: the batch is packed)" if name == "input_ids" else ""
                return f"FAIL: {name} must be one flat sequence of ints{nested}"
            if got != want[name]:
                return (f"FAIL: {what}: {name} {got}, the engine's {want[name]}: "
                        f"{_pack_mistake(name, got, seqs, want)}")
    return ("PASS: prefills of different lengths, decodes and a mix packed as ModelRunner.prepare packs them: the "
            "tokens one sequence after another, each at its own position, B + 1 offsets, each context cached + new, "
            "the last token of each sequence sampled")


# --- notebook 03: the continuous-batching decision between two steps --------------------------------------------

SCHEDULE_MAX_BATCH_SIZES = (4, 2)


def _schedule_stream() -> list[tuple[int, int, int]]:
    """check_schedule_step's requests: (arrival step, request id, tokens to generate), in arrival order. Bursts
    overfill the batch, a lull lets it drain; the ids are not in arrival order, so a sorted queue (or a set) shows."""
    import random

    rng = random.Random(3)
    arrivals = [0] * 6 + [2, 3, 5, 5, 9, 12] + [30] * 5 + [31, 33, 34, 34, 34, 40, 41, 55, 56, 56, 57, 60, 60]
    ids = rng.sample(range(10, 100), len(arrivals))
    return [(step, rid, rng.randint(1, 8)) for step, rid in zip(arrivals, ids)]


def _schedule_reference(running: list[tuple[int, int]], waiting: list[int], max_batch_size: int):
    finished = [rid for rid, left in running if left == 0]
    free = max_batch_size - (len(running) - len(finished))
    return finished, waiting[: max(free, 0)]


def _schedule_states(max_batch_size: int) -> list[tuple[int, list, list, list, list]]:
    """The reference run, step by step: (step, running, waiting, finished, admitted), the state being what
    schedule_step is called with before that step, and finished, admitted the reference's decision."""
    stream = _schedule_stream()
    lengths = {rid: n for _, rid, n in stream}
    running: list[tuple[int, int]] = []
    waiting: list[int] = []
    states, i, step = [], 0, 0
    while i < len(stream) or running or waiting:
        while i < len(stream) and stream[i][0] <= step:  # arrivals join the queue before the step is decided
            waiting.append(stream[i][1])
            i += 1
        finished, admitted = _schedule_reference(running, waiting, max_batch_size)
        states.append((step, list(running), list(waiting), finished, admitted))
        running = [(r, n) for r, n in running if r not in finished] + [(r, lengths[r]) for r in admitted]
        waiting = waiting[len(admitted):]
        running = [(r, n - 1) for r, n in running]  # the step: one token each (a newcomer's from its prefill)
        step += 1
    return states


def _judge_schedule_step(out, step: int, running: list, waiting: list, max_batch_size: int):
    """The answer at one state: (finished, admitted) as lists of ints, or the FAIL line for what is wrong with it."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return f"FAIL: return a pair of lists, (finished, admitted); at step {step} it returned {out!r}"
    try:
        finished, admitted = [int(r) for r in out[0]], [int(r) for r in out[1]]
    except (TypeError, ValueError):
        return f"FAIL: finished and admitted are lists of request ids (ints); at step {step} it returned {out!r}"
    left = dict(running)
    for name, ids in (("finished", finished), ("admitted", admitted)):
        twice = [r for r, c in Counter(ids).items() if c > 1]
        if twice:
            return f"FAIL: step {step}: duplicating a request: request {twice[0]} is {name} twice"
    stray = [r for r in finished if r not in left]
    if stray:
        return f"FAIL: step {step}: it finished request {stray[0]}, which is not running (running: {running})"
    early = [r for r in finished if left[r] > 0]
    if early:
        return (f"FAIL: step {step}: losing a request: request {early[0]} was finished with {left[early[0]]} token(s) "
                "still to generate; only a request with 0 tokens left is done")
    kept = [r for r, n in running if n == 0 and r not in finished]
    if kept:
        return (f"FAIL: step {step}: request {kept[0]} has generated its last token but was not finished: it would "
                "hold its slot (and its KV blocks) forever; a finished request leaves at once")
    again = [r for r in admitted if r in left]
    if again:
        return (f"FAIL: step {step}: duplicating a request: request {again[0]} is already running, yet it was "
                "admitted again (return only the newcomers)")
    unknown = [r for r in admitted if r not in waiting]
    if unknown:
        return f"FAIL: step {step}: request {unknown[0]} was admitted but is not in the waiting queue {waiting}"
    size = len(running) - len(finished) + len(admitted)
    if size > max_batch_size:
        return (f"FAIL: step {step}: exceeding max_batch_size: {size} requests would run with max_batch_size "
                f"{max_batch_size}; admit only while a slot is free")
    if admitted != waiting[: len(admitted)]:
        return (f"FAIL: step {step}: breaking FIFO: from the queue {waiting} (oldest first) it admitted {admitted}, "
                f"not the first {len(admitted)}; admit from the front, in arrival order (a set or a sort loses it)")
    return finished, admitted


def _name_short_admission(states: list, answers: list, short: list[int], max_batch_size: int) -> str:
    """Every answer was consistent, but some admitted fewer than the free slots allow: name the pattern if one
    explains every step (static batching, a refill a step late), else the first step that fell short."""
    static = all(adm == (waiting[:max_batch_size] if len(running) == len(fin) else [])
                 for (_, running, waiting, fin, _), (_, adm) in zip(states, answers))
    late = all(adm == waiting[: max(0, max_batch_size - len(running))]
               for (_, running, waiting, _, _), (_, adm) in zip(states, answers))
    step, running, waiting, fin, want = states[short[0]]
    adm = answers[short[0]][1]
    free = max_batch_size - (len(running) - len(fin))
    if static:
        return (f"FAIL: static batching: at step {step}, {free} slot(s) were free and {len(waiting)} request(s) "
                f"waiting, yet nothing was admitted because {len(running) - len(fin)} request(s) still ran; admit "
                "into every free slot, not only into an empty batch")
    if late:
        return (f"FAIL: refilling a step late: at step {step}, request(s) {fin} finished, leaving {free} slot(s) free, "
                f"but only {len(adm)} request(s) were admitted; count the free slots after the finished requests "
                "leave, so a freed slot is refilled in the same step")
    return (f"FAIL: step {step}: {free} slot(s) free and the queue {waiting}: it admitted {adm}, expected {want}; "
            "fill every free slot from the front of the queue")


def check_schedule_step(schedule_step: Callable) -> str:
    """Notebook 03: `schedule_step(running, waiting, max_batch_size)` is what the OnlineScheduler decides between two
    steps. `running` lists (request_id, tokens_left) in admission order, tokens_left being what the request has still
    to generate (0: the step just run produced its last token); `waiting` lists the ids of the requests that have
    arrived and not started, oldest first. It returns (finished, admitted): the running requests that leave now (no
    token left) and the waiting ones that join for the next step, from the front of the queue, while the batch has a
    free slot, a slot just freed by a finished request included. (The engine also stops at its token budget and when
    the KV pool is short: left out here.)

    The check replays a stream of requests (bursts that overfill the batch, a lull that lets it drain) at
    max_batch_size 4 and 2, calling the function at every step of a reference run, and names the mistake: static
    batching, a freed slot refilled a step late, a batch over max_batch_size, the queue out of order, a request
    lost or duplicated."""
    steps = 0
    try:
        for max_batch_size in SCHEDULE_MAX_BATCH_SIZES:
            states, answers = _schedule_states(max_batch_size), []
            for step, running, waiting, _, _ in states:
                try:
                    out = schedule_step(list(running), list(waiting), max_batch_size)
                except NotImplementedError:
                    raise
                except Exception as exc:
                    return (f"FAIL: at step {step} (running {running}, waiting {waiting}, max_batch_size "
                            f"{max_batch_size}) it raised {type(exc).__name__}: {exc}")
                answer = _judge_schedule_step(out, step, running, waiting, max_batch_size)
                if isinstance(answer, str):
                    return answer if "max_batch_size" in answer else answer + f" (max_batch_size {max_batch_size})"
                answers.append(answer)
            short = [i for i, (state, answer) in enumerate(zip(states, answers)) if answer[1] != state[4]]
            if short:
                return _name_short_admission(states, answers, short, max_batch_size) + (
                    f" (max_batch_size {max_batch_size})")
            steps += len(states)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your scheduling step"
    sizes = " and ".join(map(str, SCHEDULE_MAX_BATCH_SIZES))
    return (f"PASS: {len(_schedule_stream())} requests at max_batch_size {sizes} ({steps} steps): "
            "each finished request left at once, its slot refilled in the same step from the front of the queue, the "
            "batch never over its limit")


def _prefix_cache_case():
    """check_prefix_blocks's cache, made the engine's way (BlockManager.register under chain_hash), blocks of 4.

    Traps, each a physical block the answer must not contain: 9 holds tokens 9..12 cached as a prompt's FIRST block
    (found by a key without its parent, or past a miss); 4 and 11 follow 1..4 | 5..8 | 17..20, whose third block was
    evicted (found only past a miss); 6 and 8 hold partial blocks (found only by looking one up)."""
    from roseinfer.engine.block_manager import BlockManager, chain_hash

    a, b, c, d, e, f, g = (tuple(range(4 * i + 1, 4 * i + 5)) for i in range(7))  # 1..4, 5..8, ..., 25..28
    manager = BlockManager(16, 4)

    def register(blocks, ids, skip=()):  # chained as OnlineScheduler._register_full_blocks does
        parent = None
        for tokens, block in zip(blocks, ids):
            parent = chain_hash(parent, tokens)
            if block not in skip:
                manager.register(block, parent, tokens)

    register([a, b, c, d], [7, 3, 12, 5])
    register([c], [9])
    register([a, b, e, f, g], [7, 3, 13, 4, 11], skip={13})  # block 13 (tokens 17..20) evicted since
    register([a, b, (40, 41)], [7, 3, 6])
    register([a, b, (40, 41, 42)], [7, 3, 8])
    prompts = {  # name: (prompt, trap blocks: the mistake that takes them)
        "tokens 1..4, 9..12, 60": ([*a, *c, 60], {9: "unchained"}),
        "4 cached blocks + 2 own tokens": ([*a, *b, *c, *d, 50, 51], {}),
        "exactly 4 cached blocks": ([*a, *b, *c, *d], {5: "last token"}),
        "2 cached blocks, an evicted one, 2 more": ([*a, *b, *e, *f, *g, 61], {4: "past a miss", 11: "past a miss"}),
        "2 cached blocks + 3 own tokens": ([*a, *b, 40, 41, 42], {6: "partial", 8: "partial"}),
        "an uncached first block": ([70, 71, 72, 73, *c, *d, 62], {9: "past a miss"}),
        "tokens 9..12 first, as cached": ([*c, *d, 63], {}),
        "3 tokens": ([*a[:3]], {}),
    }
    cases = [(name, prompt, manager.match_prefix(prompt, len(prompt) - 1)[0], traps)
             for name, (prompt, traps) in prompts.items()]
    return cases, dict(manager._block_of_hash)


_PREFIX_MISTAKES = {
    "unchained": ("FAIL: hashing a block without its parent: in '{name}' block {block} was taken, cached as some "
                  "prompt's first block; equal tokens after a different prefix have other keys and values. A block's "
                  "key is chain_hash(key of the block before it, or None for the first, its tokens)"),
    "past a miss": ("FAIL: not stopping at the first miss: in '{name}' block {block} comes after a block that is not "
                    "cached; the cached prefix ends at the first block not found (the rest, from there, is computed)"),
    "partial": ("FAIL: matching a partial last block: in '{name}' block {block} holds fewer than block_size tokens; "
                "only full blocks are cached, so look up full blocks only"),
    "last token": ("FAIL: the whole prompt came from the cache in '{name}': leave its last token out of the lookup "
                   "(its logits give the first new token), so a prompt of whole blocks reuses all but the last"),
}


def check_prefix_blocks(match: Callable) -> str:
    """Notebook 10: `match(token_ids, block_size, cached)` is admission's prefix-cache lookup, the engine's
    BlockManager.match_prefix as OnlineScheduler._admit calls it. `cached` maps a full block's key,
    chain_hash(the key of the block before it, or None for the first, its tokens), to its physical block. It must
    return the physical blocks of the longest run of full blocks, from the prompt's start, found in `cached`,
    looking up every token but the last (its logits give the first new token). Checked against match_prefix on a
    cache with traps: a block cached after another prefix, blocks after an evicted one, partial blocks."""
    cases, cached = _prefix_cache_case()
    for name, prompt, expected, traps in cases:
        try:
            got = match(list(prompt), 4, dict(cached))
        except NotImplementedError:
            return "not written yet: replace the `raise NotImplementedError` with your lookup"
        except Exception as exc:
            return f"FAIL: '{name}': it raised {type(exc).__name__}: {exc}"
        if not isinstance(got, (list, tuple)) or not all(isinstance(x, int) for x in got):
            return f"FAIL: '{name}': expected a list of physical block ids (ints), got {got!r}"
        got = list(got)
        if got == expected:
            continue
        if any(x in cached for x in got):
            return f"FAIL: '{name}': it returned keys; return the physical blocks they map to (cached[key])"
        if got == list(range(len(got))) and got != expected[: len(got)]:
            return (f"FAIL: '{name}': got {got}, the blocks' positions in the prompt; return the physical blocks "
                    "(cached[key])")
        for block in got:
            if block in traps and block not in expected:
                return _PREFIX_MISTAKES[traps[block]].format(name=name, block=block)
        if got == expected[: len(got)]:
            k = len(got)
            return (f"FAIL: '{name}': stopped after {k} block(s), expected {expected}: block {k} (tokens "
                    f"{prompt[4 * k:4 * k + 4]}) is cached under chain_hash(key of block {k - 1}, its tokens)"
                    if k else f"FAIL: '{name}': found nothing, expected {expected}: block 0 (tokens {prompt[:4]}) is "
                    "cached under chain_hash(None, its tokens)")
        return f"FAIL: '{name}': got {got}, expected {expected}"
    return (f"PASS: {len(cases)} prompts, each matched to the engine's match_prefix: chained keys, full blocks only, "
            "stopping at the first miss, the last token left to compute")


# --- notebook 11: a weight packed into the panels roseinfer's bf16 kernel reads ----------------------------------


def _panel_shape_mistake(shape: tuple, n: int, k: int) -> str:
    """Names the mistake behind a packing of the wrong shape, for a weight [n, k]."""
    panels, pairs = -(-n // 32), k // 2
    if shape == (panels, 32, pairs, 2):
        return ("[N/32][32][K/2][2] keeps each column's K values together (the permute is missing). One step of the "
                "kernel's loop reads one pair of k for all 32 columns, 64 values in a row: [N/32][K/2][32][2]")
    if shape == (panels, pairs, 2, 32):
        return ("[..][2][32] puts a pair's two k values 32 apart. vdpbf16ps multiplies the two halves of each 32-bit "
                "lane, so each column's k and k + 1 sit next to each other: [..][32][2]")
    if shape == (-(-k // 32), n // 2, 32, 2):
        return ("transposed: it packed a [K, N] matrix. The weight is [N, K] (out_features, in_features, as "
                "nn.Linear keeps it): the panels run over N, the pairs over K")
    if len(shape) == 4 and shape[1:4:2] == (pairs, 2) and shape[2] != 32 and shape[0] * shape[2] >= n:
        return (f"panels of {shape[2]} columns: a panel is 32 columns, two zmm registers of 16 fp32 accumulators "
                "(the kernel's NB)")
    if n % 32 and shape == (n // 32, pairs, 32, 2):
        return (f"no padding: N = {n} is {n // 32} panels and {n % 32} columns, and those columns are lost; the last "
                "panel is padded with zero columns to 32, so there are ceil(N/32) panels")
    if not n % 32 and shape == (n // 32 + 1, pairs, 32, 2):
        return f"an extra panel: N = {n} is exactly {n // 32} panels; ceil(N/32) of them, not N//32 + 1"
    return "expected [ceil(N/32), K/2, 32, 2]"


def _panel_value_mistake(out, weight, want, named: bool) -> str:
    """Names the mistake behind a packing of the right shape and dtype but other values. With `named`, weight[n, k]
    is 1000 n + k + 1, so a misplaced value says which weight it is."""
    import torch

    from roseinfer.kernels.cpu.bindings import unpack_panels

    n, k = weight.shape
    panels = want.shape[0]
    padded = weight.new_zeros(panels * 32, k)
    padded[:n] = weight
    if torch.equal(out, padded.reshape(want.shape)):
        return ("the weight's values in their old order: a reshape (or view) to [N/32, K/2, 32, 2] moves nothing. "
                "View it as [N/32, 32, K/2, 2] and permute(0, 2, 1, 3), so that one pair of k for 32 columns lies "
                "together")
    if torch.equal(out, padded.view(panels, 32, 2, k // 2).permute(0, 3, 1, 2)):
        return ("pairs not interleaved: packed[p, j, c] holds W[n, j] and W[n, j + K/2]. The kernel multiplies the "
                "pair x[2j], x[2j + 1], so the weight's pair is W[n, 2j], W[n, 2j + 1]")
    if torch.equal(unpack_panels(out, n), weight):
        return ("the padding is not zero: the columns past N must be zeros (new_zeros, not empty: the bytes packed "
                "should not depend on what the memory held before)")
    p, j, c, t = (int(i) for i in (out != want).nonzero()[0])
    row, col = 32 * p + c, 2 * j + t
    where = f"packed[{p}, {j}, {c}, {t}] should hold W[32p + c, 2j + t] = " + (
        f"W[{row}, {col}]" if row < n else f"0 (padding: column {row} is past N)")
    got = float(out[p, j, c, t])
    if named and got == 0:
        return f"{where}; it holds 0"
    if named and got == int(got) and 0 < got <= n * 1000:
        return f"{where}; it holds W[{int(got - 1) // 1000}, {int(got - 1) % 1000}]"
    return f"{where} = {float(want[p, j, c, t]):g}; it holds {got:g}"


def check_pack_panels(pack: Callable) -> str:
    """Notebook 11: `pack(weight)` lays a projection's weight out as roseinfer's bf16 kernel (linear_bf16.c) reads
    it, as bindings.pack_panels does when PackedLinear is built. weight is [N, K] (out_features, in_features; K even);
    the answer is [ceil(N/32), K/2, 32, 2] with packed[p, j, c, t] = W[32p + c, 2j + t]: panels of 32 output columns,
    in each one pair of k for all 32 columns after another, the columns past N zero. The weight's dtype is kept, and
    the tensor is contiguous: the kernel reads its memory in order, not through strides.

    Compared with pack_panels on a 70 x 12 fp32 weight whose values name their place (1000 n + k + 1; a partial last
    panel) and a 96 x 40 bf16 one (whole panels); the mistake is named. Where this CPU runs the kernel, it then
    multiplies by the answer's panels."""
    import torch

    from roseinfer.kernels.cpu.bindings import bf16_linear, load_bf16_linear_kernel, pack_panels

    gen = torch.Generator().manual_seed(0)
    named = (1000 * torch.arange(70)[:, None] + torch.arange(12) + 1).float()
    cases = (("a 70 x 12 weight (two panels and 6 columns)", named, True),
             ("a 96 x 40 bf16 weight (three whole panels)", torch.randn(96, 40, generator=gen).bfloat16(), False))
    for what, weight, is_named in cases:
        want = pack_panels(weight, 32)
        try:
            out = pack(weight.clone())
        except NotImplementedError:
            return "not written yet: replace the `raise NotImplementedError` with your packing"
        except Exception as exc:
            hint = (f" (N = {weight.shape[0]} is not a whole number of 32-column panels: pad the weight with zero rows "
                    "to the next multiple of 32 first)" if "invalid for input of size" in str(exc) else "")
            return f"FAIL: {what}: it raised {type(exc).__name__}: {exc}{hint}"
        n, k = weight.shape
        if not isinstance(out, torch.Tensor):
            return f"FAIL: {what}: expected a tensor [ceil(N/32), K/2, 32, 2], got {type(out).__name__}"
        if tuple(out.shape) != tuple(want.shape):
            return (f"FAIL: {what}: shape {tuple(out.shape)}, expected {tuple(want.shape)}: "
                    + _panel_shape_mistake(tuple(out.shape), n, k))
        if out.dtype != weight.dtype:
            return (f"FAIL: {what}: dtype {out.dtype}, the weight's is {weight.dtype}: keep it (the engine packs "
                    "bf16 weights, and the kernel reads 2-byte values)")
        if not torch.equal(out, want):
            return f"FAIL: {what}: " + _panel_value_mistake(out, weight, want, is_named)
        if not out.is_contiguous():
            return (f"FAIL: {what}: the right values, but not contiguous: permute only changes the strides, and the "
                    "kernel reads the memory in order; end with .contiguous()")
    if load_bf16_linear_kernel() is None:
        return ("PASS: panels of 32 columns, one pair of k for all of them after another, a partial panel padded with "
                "zeros, as pack_panels packs them (this CPU cannot run roseinfer's bf16 kernel on them)")
    x = torch.randn(5, 40, generator=gen).bfloat16()
    if not torch.equal(bf16_linear(x, out, None, False, 96), bf16_linear(x, want, None, False, 96)):
        return "FAIL: roseinfer's kernel, given these panels, computed another y than with pack_panels' own"
    return ("PASS: panels of 32 columns, one pair of k for all of them after another, a partial panel padded with "
            "zeros, as pack_panels packs them; roseinfer's kernel, given them, computed y = x W^T for 5 rows as with "
            "its own")


# --- notebook 04: one pass of the scheduler manager's worker ------------------------------------------------------

# Requests submitted before each pass of check_worker_pass: (request id, its tokens, the steps its prompt takes).
# Request 12's prompt takes two steps (a chunked prefill), so it gets no token in its first step, between 7 and 3.
WORKER_SCRIPT: tuple[tuple[tuple[int, tuple[int, ...], int], ...], ...] = (
    (),  # idle: nothing submitted, nothing in flight
    ((7, (700, 701, 702), 1), (12, (1200, 1201), 2), (3, (300,), 1)),  # a burst; 3 ends in its first step
    (),
    ((5, (500, 501), 1), (9, (900,), 2)),  # joins requests in flight
    (),
    (),  # idle again: every request has ended
    ((1, (100, 101), 1),),
    ((2, (200,), 1),),  # 2 and 1 end in the same step
    (),  # idle
)
SCHEDULER_OWN_IDS = 1000  # the stand-in scheduler numbers a request from here when add_request gets no request_id


class _WaitedOnInbox(Exception):
    """Raised by check_worker_pass's inbox when the pass waits on it while it is empty."""


class _Inbox:
    """check_worker_pass's inbox, with queue.SimpleQueue's methods. A wait on it while it is empty raises (a real
    queue would hang the pass) rather than block."""

    def __init__(self) -> None:
        from collections import deque

        self._items: deque = deque()

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        self._items.append(item)

    def put_nowait(self, item) -> None:
        self._items.append(item)

    def get(self, block: bool = True, timeout: float | None = None):
        import queue

        if self._items:
            return self._items.popleft()
        if block:
            raise _WaitedOnInbox
        raise queue.Empty

    def get_nowait(self):
        return self.get(False)

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


class _ScriptedRequest:
    """A validated request, as the stand-in scheduler sees it: its tokens are scripted, not sampled."""

    def __init__(self, request_id: int, tokens: tuple[int, ...], prefill_steps: int) -> None:
        self.request_id, self.tokens, self.prefill_steps = request_id, tokens, prefill_steps

    def __repr__(self) -> str:
        return f"<request {self.request_id}>"


class _ScriptedScheduler:
    """check_worker_pass's stand-in for the manager's OnlineScheduler, with its method names; `step()` is
    `engine.step(scheduler)`. Every request in flight is in every step; a request's prompt takes `prefill_steps`
    steps, the last of them giving its first token; it ends in the step that gives its last token."""

    def __init__(self) -> None:
        import itertools

        self._own_ids = itertools.count(SCHEDULER_OWN_IDS)
        self._running: dict[int, list] = {}  # scheduler id -> [request, steps taken]
        self._finished: list[int] = []  # ended, not yet popped
        self.pass_index = 0
        self.added = 0
        self.steps = 0  # in this pass
        self.passes_stepped = 0
        self.idle_steps = 0  # in this pass, with nothing in flight
        self.produced_at: dict[int, int] = {}  # token -> the pass whose step gave it
        self.finished_at: dict[int, int] = {}  # handler's request id -> the pass whose step ended it

    def add_request(self, request, request_id: int | None = None) -> int:
        rid = next(self._own_ids) if request_id is None else request_id
        if rid in self._running:
            raise ValueError(f"request {rid} is already in the scheduler")
        self._running[rid] = [request, 0]
        self.added += 1
        return rid

    def has_unfinished(self) -> bool:
        return bool(self._running)

    def step(self) -> dict[int, int]:
        self.steps += 1
        self.passes_stepped += self.steps == 1
        if not self._running:
            self.idle_steps += 1
            return {}
        tokens = {}
        for rid, entry in list(self._running.items()):
            request, taken = entry[0], entry[1] + 1
            entry[1] = taken
            made = taken - request.prefill_steps + 1  # tokens given so far, this step's included
            if made >= 1:
                tokens[rid] = request.tokens[made - 1]
                self.produced_at[tokens[rid]] = self.pass_index
            if made == len(request.tokens):
                del self._running[rid]
                self._finished.append(rid)
                self.finished_at[request.request_id] = self.pass_index
        return tokens

    def pop_finished_ids(self) -> list[int]:
        ids, self._finished = self._finished, []
        return ids


def _worker_requests() -> dict[int, tuple[int, ...]]:
    return {rid: tokens for arrivals in WORKER_SCRIPT for rid, tokens, _ in arrivals}


def _run_worker_script(worker_pass: Callable):
    """Calls `worker_pass(inbox, scheduler, outputs)` once a pass of WORKER_SCRIPT, the script's requests submitted
    to the inbox before their pass, as a handler would: (request id, request, its own queue). Returns the FAIL line
    of a pass gone wrong, or (got, scheduler, outputs): got maps each request id to what its queue received, as
    (pass, item) pairs, item a token or None (its end)."""
    import queue

    inbox, scheduler, outputs = _Inbox(), _ScriptedScheduler(), {}
    queues: dict[int, queue.SimpleQueue] = {}
    got: dict[int, list[tuple[int, int | None]]] = {}
    submitted = 0
    for index, arrivals in enumerate(WORKER_SCRIPT):
        for rid, tokens, prefill_steps in arrivals:
            queues[rid] = queue.SimpleQueue()
            got[rid] = []
            inbox.put((rid, _ScriptedRequest(rid, tokens, prefill_steps), queues[rid]))
        submitted += len(arrivals)
        in_flight = len(scheduler._running)
        scheduler.pass_index, scheduler.steps, scheduler.idle_steps = index, 0, 0
        failed = _call_worker_pass(worker_pass, inbox, scheduler, outputs, index, in_flight)
        for rid, q in queues.items():  # what each handler reads, after the pass
            while True:
                try:
                    got[rid].append((index, q.get_nowait()))
                except queue.Empty:
                    break
        failed = _wrong_request(got) or failed  # tokens misrouted before an error are the first mistake
        if failed:
            return failed
        if scheduler.idle_steps:
            return (f"FAIL: stepping with nothing to do: at pass {index} the inbox was empty and no request was in "
                    "flight, yet it called step(); check has_unfinished() first (an idle worker would spin, stepping "
                    "empty batches)")
        if not inbox.empty():
            return (f"FAIL: submissions pile up: at pass {index}, {inbox.qsize()} of {len(arrivals)} requests "
                    "submitted since the last pass were left in the inbox; take every one each pass (one a pass "
                    "makes a burst of n wait up to n passes)")
        if scheduler.added != submitted:
            return (f"FAIL: at pass {index}, {submitted} requests had been taken off the inbox but "
                    f"{scheduler.added} added to the scheduler: add each one, "
                    "scheduler.add_request(request, request_id=request_id)")
        if scheduler.steps == 0 and scheduler._running:
            return (f"FAIL: at pass {index} requests were in flight but it did not step: take the inbox first, then "
                    "step if has_unfinished(), so that a new request is in this pass's step")
        if scheduler.steps > 1:
            return (f"FAIL: at pass {index} it stepped {scheduler.steps} times: one step a pass, so that what "
                    "handlers submit meanwhile joins the next step")
    return got, scheduler, outputs


def _call_worker_pass(worker_pass: Callable, inbox, scheduler, outputs, index: int, in_flight: int) -> str | None:
    """One pass of the reader's function: None, or the FAIL line for what it raised."""
    import queue

    try:
        worker_pass(inbox, scheduler, outputs)
    except NotImplementedError:
        raise
    except _WaitedOnInbox:
        return (f"FAIL: at pass {index} it waited on an empty inbox ({in_flight} request(s) in flight): a pass never "
                "waits (with requests in flight, a wait stalls their steps); take what is there, inbox.get_nowait() "
                "until queue.Empty, and return if there is nothing to step: the loop around waits for work")
    except queue.Empty:
        return (f"FAIL: at pass {index} queue.Empty escaped the pass: it means the inbox is drained; catch it and go "
                "on to the step")
    except KeyError as exc:
        rid = exc.args[0] if exc.args else "?"
        if isinstance(rid, int) and rid >= SCHEDULER_OWN_IDS:
            return (f"FAIL: KeyError {rid} at pass {index}: the scheduler numbered the request itself (add_request "
                    "without request_id) and step() gives its tokens under that number; pass request_id=the "
                    "handler's id, so the ids step() gives are the ones in outputs")
        return (f"FAIL: KeyError {rid!r} at pass {index}: no queue for that request; put each request's queue in "
                "outputs[request_id] when you take it off the inbox")
    except Exception as exc:
        return f"FAIL: at pass {index} it raised {type(exc).__name__}: {exc}"
    return None


def _wrong_request(got) -> str | None:
    """The FAIL line for a token in another request's queue, None if every token is in its own."""
    owner = {token: rid for rid, tokens in _worker_requests().items() for token in tokens}
    for rid, items in got.items():
        for index, item in items:
            if item is not None and owner.get(item) != rid:
                whose = f"request {owner[item]}'s" if item in owner else "no request's"
                return (f"FAIL: tokens routed to the wrong request: at pass {index}, request {rid}'s queue got token "
                        f"{item}, {whose}; route by the id step() gives, outputs[rid], not by position (a request "
                        "mid-prefill gets no token in a step) nor to the last queue taken")
    return None


def _judge_worker_run(got, scheduler, outputs) -> str:
    requests = _worker_requests()
    ends = {rid: [index for index, item in items if item is None] for rid, items in got.items()}
    for rid, passes in ends.items():
        if passes and passes[0] < scheduler.finished_at.get(rid, len(WORKER_SCRIPT)):
            return (f"FAIL: request {rid} was ended at pass {passes[0]} but had not finished: end a request only when "
                    "pop_finished_ids() reports it (one mid-prefill gets no token in a step, and is not finished)")
    for rid, passes in ends.items():
        if len(passes) > 1:
            return (f"FAIL: an end signalled {len(passes)} times: request {rid}'s queue got None at passes {passes}; "
                    "its handler stops at the first, the rest land in a stream that is over; end a request once, when "
                    "pop_finished_ids() reports it")
    for rid, items in got.items():
        values = [item for _, item in items]
        if None in values[:-1]:
            return (f"FAIL: request {rid} got token(s) {values[values.index(None) + 1:]} after its end: its handler "
                    "has stopped reading, so they are lost; put a request's last token first, then its end")
    tokens = {rid: [item for _, item in items if item is not None] for rid, items in got.items()}
    for rid, mine in tokens.items():
        twice = [t for t, c in Counter(mine).items() if c > 1]
        if twice:
            return f"FAIL: request {rid} got token {twice[0]} twice: hand each token over once"
    missing = {rid: [t for t in requests[rid] if t not in mine] for rid, mine in tokens.items()}
    missing = {rid: lost for rid, lost in missing.items() if lost}
    if missing:
        rid, lost = next(iter(missing.items()))
        if all(lost == [requests[r][-1]] and scheduler.produced_at.get(lost[0]) == scheduler.finished_at.get(r)
               for r, lost in missing.items()):  # only last tokens, each given by the step that ended its request
            return (f"FAIL: dropping a token: request {rid}'s last token, {lost[0]}, was lost ({len(missing)} "
                    "request(s) lost theirs); it came in the step that finished the request: put the token, then "
                    "the end")
        return (f"FAIL: dropping a token: request {rid} never got token(s) {lost}; every token step() gives goes to "
                "its request's queue, in the pass that gave it")
    for rid, mine in tokens.items():
        if mine != list(requests[rid]):
            return f"FAIL: request {rid}'s tokens came out of order: {mine}, expected {list(requests[rid])}"
    for rid, items in got.items():
        late = [(index, item) for index, item in items if item is not None and index != scheduler.produced_at[item]]
        if late:
            index, token = late[0]
            return (f"FAIL: request {rid}'s token {token}, given by the step of pass {scheduler.produced_at[token]}, "
                    f"reached its queue at pass {index}: hand each token over in the pass whose step gave it")
    for rid, passes in ends.items():  # late before never: ends read a pass late are lost when the next is idle
        if passes and passes[0] != scheduler.finished_at[rid]:
            return (f"FAIL: request {rid} finished in the step of pass {scheduler.finished_at[rid]} but its end came "
                    f"at pass {passes[0]}: call pop_finished_ids() after step(), in the same pass, or its handler "
                    "waits on")
    for rid, passes in ends.items():
        if rid in scheduler.finished_at and not passes:
            return (f"FAIL: a finished request never signalled: request {rid} finished at pass "
                    f"{scheduler.finished_at[rid]} but its queue never got its end (None): its handler would wait "
                    "forever; put None in the queue of every id pop_finished_ids() gives")
    if outputs:
        return (f"FAIL: request(s) {sorted(outputs)} ended but their queues are still in outputs: it would grow by one "
                "entry a request, forever; pop a request's queue when you end it")
    idle = len(WORKER_SCRIPT) - scheduler.passes_stepped
    return (f"PASS: {len(requests)} requests over {len(WORKER_SCRIPT)} passes ({idle} with nothing to do, not "
            "stepped): every submission taken in its pass, one step a pass with work, each token in its own request's "
            "queue in the pass that made it, each end once, after the last token")


def check_worker_pass(worker_pass: Callable) -> str:
    """Notebook 04: `worker_pass(inbox, scheduler, outputs)` is one pass of SchedulerManager's worker loop (its
    `_take_new_work`, then `engine.step`, `pop_finished_ids` and the delivery to the streams), which the loop around
    it repeats. `inbox` is a queue (queue.SimpleQueue's methods) of what handlers submitted since the last pass:
    (request_id, request, out), `out` that request's own queue.SimpleQueue, which its handler reads. `scheduler` has
    the OnlineScheduler's add_request(request, request_id=None), has_unfinished() and pop_finished_ids(), and step(),
    which stands for engine.step(scheduler): one batch for every request in flight, {request_id: new token}.
    `outputs` is the pass's own dict, request_id -> out, kept from one pass to the next (it starts empty).

    One pass: take every request off the inbox into the scheduler (its queue into outputs); if nothing is in flight,
    return (the loop waits for work); else step once, put each new token in its request's queue, and put None (the
    end) in the queue of each request that finished, after its last token, and drop that queue from outputs.

    The check runs a script of 9 passes with a stand-in scheduler (bursts, a request joining mid-flight, a chunked
    prefill that gets no token in a step, idle passes) and names the mistake: tokens routed to the wrong request, a
    finished request never signalled, an end signalled twice, requests taken one a pass, stepping with nothing to
    do, a token dropped. No thread is started: the loop and the handlers are the check's."""
    try:
        run = _run_worker_script(worker_pass)
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your pass"
    if isinstance(run, str):
        return run
    return _judge_worker_run(*run)


# --- notebook 05: the idle worker sleeps on the wake-up event -----------------------------------------------------

IDLE_WINDOW_S = 0.03  # how long an idle worker is watched for naps or spinning (a right answer is seen asleep at once)
IDLE_SETTLE_S = 0.2  # the most a right answer may take to get somewhere on a loaded machine; only odd answers wait it
IDLE_SPIN_LOOKS = 100  # looks for work within the window that mean it never sleeps (5 ms naps make about 6)
IDLE_MAX_POINTS = 64  # the moments between the worker's operations where a request is put, per kind of work
_IDLE_OPS = {"acquire": "taking of self._lock", "release": "release of self._lock", "pending": "look at self._pending",
             "aborts": "look at self._aborts", "stopping": "look at self._stopping", "clear": "clear()",
             "is_set": "is_set()", "wait": "wait()", "set": "set()"}
_IDLE_WORK = {"request": "a request (self._pending)", "abort": "an abort (self._aborts)",
              "close": "close() (self._stopping)"}


class _IdleAbandoned(BaseException):
    """Raised in the worker thread at its next operation once the check is done with it: no thread is left running.
    A BaseException, so that an `except Exception` in the answer does not swallow it."""


class _IdleLock:
    """The stand-in manager's self._lock: a threading.Lock whose every use by the worker is noted."""

    def __init__(self, run) -> None:
        self._run = run

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self._run.note("acquire")
        if not blocking:
            return self._run.raw_lock.acquire(False)
        while not self._run.raw_lock.acquire(timeout=0.01):  # a worker that deadlocks itself still ends
            self._run.check_abandoned()
        return True

    def release(self) -> None:
        self._run.raw_lock.release()
        self._run.note("release")

    def locked(self) -> bool:
        return self._run.raw_lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class _IdleEvent:
    """The stand-in manager's self._wakeup: a threading.Event whose every use by the worker is noted."""

    def __init__(self, run) -> None:
        import threading

        self._run, self.event = run, threading.Event()

    def set(self) -> None:
        self._run.note("set")
        self.event.set()

    def clear(self) -> None:
        self._run.note("clear")
        self.event.clear()

    def is_set(self) -> bool:
        self._run.note("is_set")
        return self.event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        self._run.note("wait", timeout)
        try:
            return self.event.wait(timeout)
        finally:
            self._run.left_wait()


class _IdleManager:
    """The `self` that check_worker_idle passes: the SchedulerManager fields the idle worker uses, every use noted."""

    before_clear = None  # ClearOutsideLockManager's hook (the tests pass that variant's _idle): none here

    def __init__(self, run) -> None:
        self._run, self._lock, self._wakeup = run, _IdleLock(run), _IdleEvent(run)
        self.num_idle_wakeups = 0

    @property
    def _pending(self) -> list:
        self._run.note("pending")
        return self._run.pending

    @property
    def _aborts(self) -> list:
        self._run.note("aborts")
        return self._run.aborts

    @property
    def _stopping(self) -> bool:
        self._run.note("stopping")
        return self._run.stopping

    def _wait_for_work(self) -> None:  # SchedulerManager's
        self._wakeup.wait()


class _IdleRun:
    """One worker thread running `idle` as SchedulerManager._worker_loop does (idle, take the work if any, idle
    again), with no work at first. With `put_at`, the check's hook puts one piece of work (`kind`) in, from the
    worker's own thread, right before the worker's operation number `put_at` (or the first one after it that does
    not run under the lock): the submitter's moment, held still, as notebook 05's hook holds it."""

    def __init__(self, idle: Callable, stale: bool = False, kind: str = "request", put_at: int | None = None) -> None:
        import threading
        import time

        self.cv, self.raw_lock = threading.Condition(), threading.Lock()
        self.pending: list = []
        self.aborts: list = []
        self.stopping = False
        self.manager = _IdleManager(self)
        if stale:  # a set() left by a request the worker took while it was busy
            self.manager._wakeup.event.set()
        self.kind, self.put_at, self.put_where = kind, put_at, None
        self.log: list[tuple[str, str]] = []  # (whose, what): "worker" or "put", in order
        self.ops = self.looks = self.laps = self.waits = 0
        self.in_wait, self.wait_timeout = False, None
        self.served = self.done = self.abandoned = False
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._work, args=(idle,), name="check_worker_idle", daemon=True)
        self.thread.start()

    def _work(self, idle: Callable) -> None:
        try:
            while True:
                with self.cv:
                    self.check_abandoned()
                    self.laps += 1
                    self.looks += 1
                idle(self.manager)
                if not self.raw_lock.acquire(timeout=IDLE_SETTLE_S):  # _take_new_work
                    raise RuntimeError("it returned with self._lock still held")
                try:
                    with self.cv:
                        self.check_abandoned()
                        if self.pending or self.aborts or self.stopping:
                            self.served = True
                            return
                finally:
                    self.raw_lock.release()
        except _IdleAbandoned:
            pass
        except BaseException as exc:
            self.error = exc
        finally:
            with self.cv:
                self.done = True
                self.cv.notify_all()

    def check_abandoned(self) -> None:
        if self.abandoned:
            raise _IdleAbandoned

    def note(self, what: str, timeout: float | None = None) -> None:
        """Called right before the worker's operation `what` takes effect (a release: right after), in its thread."""
        with self.cv:
            self.check_abandoned()
            index, self.ops = self.ops, self.ops + 1
            if what == "release":  # already done: a put at this moment comes after it
                self.log.append(("worker", what))
            put = (self.put_at is not None and self.put_where is None and index >= self.put_at
                   and not self.raw_lock.locked())  # a submitter cannot queue while the worker holds the lock
            if put:
                self.put_where = index
        if put:
            self.put("worker")
        with self.cv:  # after the put: the worker is not seen asleep before a put at this moment is in
            if what != "release":
                self.log.append(("worker", what))
            self.looks += what in ("pending", "is_set", "wait")
            if what == "wait":
                self.waits += 1
                self.in_wait, self.wait_timeout = True, timeout
            self.cv.notify_all()

    def left_wait(self) -> None:
        with self.cv:
            self.in_wait = False
            self.cv.notify_all()
            self.check_abandoned()

    def put(self, who: str) -> bool:
        """What the manager's callers do: queue the work under the lock, then set the event. False if the lock
        could not be had (the worker holds it while it sleeps)."""
        if not self.raw_lock.acquire(timeout=IDLE_SETTLE_S if who == "check" else -1):
            return False
        try:
            with self.cv:  # queued and set at once, as far as the watching thread can tell
                if self.kind == "request":
                    self.pending.append("request")
                elif self.kind == "abort":
                    self.aborts.append(7)
                else:
                    self.stopping = True
                self.manager._wakeup.event.set()
                self.log.append(("put", "set"))
                self.cv.notify_all()
        finally:
            self.raw_lock.release()
        return True

    def work(self) -> bool:
        return bool(self.pending or self.aborts or self.stopping)

    def asleep(self, timed: bool = False) -> bool:
        """In a wait that only a set() ends (a timed one too if `timed`), the event clear, no work queued."""
        return (self.in_wait and (timed or self.wait_timeout is None) and not self.manager._wakeup.event.is_set()
                and not self.work())

    def lost(self) -> bool:
        """Asleep on the event, the event clear, work queued: nothing will wake it (a timed wait: not before its nap)."""
        return self.in_wait and not self.manager._wakeup.event.is_set() and self.work()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        with self.cv:
            self.cv.wait_for(predicate, timeout)

    def finish(self) -> None:
        with self.cv:
            self.abandoned = True
            self.cv.notify_all()
        self.manager._wakeup.event.set()  # a sleeping worker wakes, and ends at its next operation
        self.thread.join(IDLE_SETTLE_S)


def _idle_error(run: _IdleRun) -> str:
    if isinstance(run.error, NotImplementedError):
        return "not written yet: replace the `raise NotImplementedError` with your idle wait"
    return f"FAIL: it raised {type(run.error).__name__}: {run.error}"


def _judge_idle(run: _IdleRun, stale: bool) -> str | None:
    """Nothing to do: the worker must be asleep on the event after one look. Else name what it does instead."""
    import time

    ms = (time.perf_counter() - run.started) * 1000
    with run.cv:
        if run.error is not None:
            return _idle_error(run)
        if run.in_wait and run.raw_lock.locked():
            return ("FAIL: it waits while holding self._lock: no request can be queued to wake it (add_request "
                    "queues under that lock); release the lock, then wait")
        if run.in_wait and run.waits == 1 and run.laps == 1 and not run.manager._wakeup.event.is_set():
            return None
        log = [what for whose, what in run.log if whose == "worker"]
        first_wait = log.index("wait") if "wait" in log else len(log)
        if stale and "clear" not in log and run.waits >= 2:
            return (f"FAIL: never clearing: the event stays set from a request the worker already took, so every "
                    f"wait returns at once and the idle worker spins ({run.looks} looks for work in {ms:.0f} ms, "
                    "none there); clear it when you find no work")
        if stale and run.in_wait and run.waits == 2 and "clear" in log and log.index("clear") > first_wait:
            return ("FAIL: clearing after the wait: a set() left by a request the worker already took woke the idle "
                    "worker once for nothing (its first wait returned at once); clear when you find no work, in the "
                    "same critical section as that check, then wait")
        if run.looks >= IDLE_SPIN_LOOKS:
            return (f"FAIL: busy-spinning: with nothing to do it looked for work {run.looks} times in {ms:.0f} ms and "
                    "never slept (returning at once is a spin too: the worker loop calls it again); wait on "
                    "self._wakeup")
        if run.waits >= 2:
            return (f"FAIL: polling: with nothing to do it woke {run.waits} times in {ms:.0f} ms, every wait "
                    f"ending at its timeout ({run.wait_timeout} s): a nap by another name; wait() with no timeout, "
                    "until a request sets the event")
        if run.laps >= 2 or run.looks >= 2:
            return (f"FAIL: polling: with nothing to do it looked for work {run.looks} times in {ms:.0f} ms, "
                    "sleeping a fixed nap in between: a request waits for the rest of the nap, and an idle server "
                    "keeps waking up; wait on self._wakeup, which a request sets")
        return (f"FAIL: after {ms:.0f} ms with nothing to do it is neither asleep on self._wakeup nor looking for "
                "work: sleeping a fixed nap? Wait on the event, which a request sets")


def _idle_watch(idle: Callable, stale: bool) -> str | None:
    """No work, the event clear (or `stale`: set by a request already taken): asleep at once? Then a request."""
    run = _IdleRun(idle, stale=stale)
    try:
        run.wait_for(lambda: run.done or run.asleep(), IDLE_WINDOW_S)
        with run.cv:  # neither asleep nor round twice yet: a loaded machine, or a long nap
            slow = not (run.done or run.in_wait) and run.looks < 3 and run.laps < 2
        if slow:
            run.wait_for(lambda: run.done or run.in_wait or run.looks >= 3 or run.laps >= 2, IDLE_SETTLE_S)
        verdict = _judge_idle(run, stale)
        if verdict:
            return verdict
        if not run.put("check"):
            return "FAIL: it waits while holding self._lock: no request can be queued to wake it"
        run.wait_for(lambda: run.done or run.lost(), IDLE_SETTLE_S)
        if run.error is not None:
            return _idle_error(run)
        if not run.served:
            return ("FAIL: a request submitted while the worker slept (queued, then self._wakeup.set()) did not wake "
                    "it: wait on self._wakeup")
        return None
    finally:
        run.finish()


def _judge_idle_point(run: _IdleRun, where: str) -> str:
    """The work was queued and the event set, yet the worker sleeps: name why."""
    log = [what for whose, what in run.log if whose == "worker"]
    field = {"abort": "aborts", "close": "stopping"}.get(run.kind)
    work = _IDLE_WORK[run.kind]
    if field and field not in log:
        return (f"FAIL: it looks only at self._pending: {work} queued {where} set the event, yet the worker "
                f"cleared it and sleeps, the work unseen; there is work when self._pending or self._aborts or "
                "self._stopping")
    put = run.log.index(("put", "set"))
    if "clear" in [what for whose, what in run.log[put:] if whose == "worker"]:
        return (f"FAIL: lost wake-up: {work} queued {where} set the event, and the worker's clear() after it "
                "erased that set(): the worker sleeps with the work queued until something else wakes it. Clear in "
                "the same critical section as the check for work, under self._lock (or before the check)")
    return (f"FAIL: lost wake-up: {work} queued {where} set the event, yet the worker sleeps with it queued: after "
            "the check finds no work, only the event may decide whether to sleep")


def _idle_point(idle: Callable, kind: str, point: int) -> tuple[str | None, bool]:
    """Put `kind` of work in right before the worker's operation number `point`: is it taken? (verdict, whether the
    put came before the worker fell asleep)."""
    run = _IdleRun(idle, kind=kind, put_at=point)
    try:
        run.wait_for(lambda: run.done or run.asleep(timed=True) or run.lost(), IDLE_SETTLE_S)
        with run.cv:
            if run.error is not None:
                return _idle_error(run), True
            if run.served:
                return None, True
            inline = run.put_where is not None
            if inline:  # the worker's operations on either side of the put, as they took effect
                put = run.log.index(("put", "set"))
                before = [_IDLE_OPS[what] for whose, what in run.log[:put] if whose == "worker"][-1:]
                after = [_IDLE_OPS[what] for whose, what in run.log[put:] if whose == "worker"][:1]
                where = " and ".join(f"{side} its {op[0]}" for side, op in (("after", before), ("before", after))
                                     if op)
        if not inline:  # asleep before `point` operations: put it in now, from this thread
            if not run.put("check"):
                return "FAIL: it waits while holding self._lock: no request can be queued to wake it", False
            run.wait_for(lambda: run.done or run.lost(), IDLE_SETTLE_S)
            where = "while the worker slept"
        with run.cv:
            if run.error is not None:
                return _idle_error(run), inline
            if run.served:
                return None, inline
            if run.lost():
                return _judge_idle_point(run, where), inline
        return (f"FAIL: {_IDLE_WORK[kind]} queued {where}: after {IDLE_SETTLE_S * 1000:.0f} ms the worker had neither "
                "returned to take it nor gone to sleep"), inline
    finally:
        run.finish()


def check_worker_idle(idle: Callable) -> str:
    """Notebook 05: `idle(self)` is SchedulerManager._idle, what the worker does when it has nothing to step. `self`
    has the manager's `_lock`, `_pending` (queued requests), `_aborts`, `_stopping` (close() was called) and `_wakeup`
    (a threading.Event). Callers queue work under `_lock`, then call `_wakeup.set()`. It must return at once if
    there is work, else sleep on `_wakeup` until a set() (no timeout, no nap), clearing the event at the point where
    no set() can be lost, and return when woken; the worker loop then takes the work and calls it again if none.

    The check watches it idle (the event clear, then set by a request already taken) and puts work in right before
    each of its operations in turn, from the worker's own thread, so that every interleaving with a submitter is
    tried exactly, not by luck. It names the mistake: a lost wake-up, polling with a nap, busy-spinning, never
    clearing the event."""
    for stale in (False, True):
        verdict = _idle_watch(idle, stale)
        if verdict:
            return verdict
    points = 0
    for kind in _IDLE_WORK:
        for point in range(IDLE_MAX_POINTS):
            verdict, inline = _idle_point(idle, kind, point)
            if verdict:
                return verdict
            points += 1
            if not inline:  # the worker was asleep before this operation: later points are the same
                break
    return (f"PASS: asleep on the event at once when idle, even with a stale set(); woken by a request, an abort and "
            f"close() put in at each of {points} moments around its check, clear and wait: no wake-up lost")
