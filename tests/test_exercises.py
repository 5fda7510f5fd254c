"""The notebooks' exercise checks must pass the solutions and fail the wrong answers a learner writes."""

from __future__ import annotations

import hashlib
import itertools

import pytest
import torch

from roseinfer.bench.exercises import (
    check_generated_ids,
    check_gqa_decode,
    check_graph_bucket,
    check_kv_cache_attention,
    check_prefix_router,
)
from roseinfer.bench.solutions import (
    get_generated_ids,
    gqa_decode,
    graph_bucket,
    kv_cache_attention,
    prefix_router,
)


def test_prefix_router_solution_passes():
    assert check_prefix_router(prefix_router).startswith("PASS")


def test_prefix_router_unwritten_says_so():
    def unwritten(prompt, replicas):
        raise NotImplementedError

    assert check_prefix_router(unwritten).startswith("not written yet")


def test_prefix_router_round_robin_fails():
    turn = itertools.count()
    assert "several replicas" in check_prefix_router(lambda prompt, replicas: replicas[next(turn) % len(replicas)])


def test_prefix_router_one_replica_fails():
    assert "one replica would do all the work" in check_prefix_router(lambda prompt, replicas: replicas[0])


def test_prefix_router_whole_prompt_hash_fails():
    # hashing the whole prompt (question included) is the usual first try: it scatters one system prompt's users
    def whole_prompt(prompt, replicas):
        return replicas[int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % len(replicas)]

    assert "several replicas" in check_prefix_router(whole_prompt)


def test_prefix_router_unknown_replica_fails():
    assert "not given" in check_prefix_router(lambda prompt, replicas: "http://elsewhere")


def test_gqa_decode_solution_passes_and_wrong_answers_fail():
    assert check_gqa_decode(gqa_decode).startswith("PASS")

    def unwritten(q, k, v, scale):
        raise NotImplementedError

    def interleaved(q, k, v, scale):  # k.repeat instead of repeat_interleave: head h reads h % kv_heads
        group = q.shape[0] // k.shape[1]
        k, v = k.repeat(1, group, 1), v.repeat(1, group, 1)
        return (((k * q).sum(-1) * scale).softmax(dim=0)[..., None] * v).sum(0)

    def unscaled(q, k, v, scale):
        return gqa_decode(q, k, v, 1.0)

    assert check_gqa_decode(unwritten).startswith("not written yet")
    assert "h // group" in check_gqa_decode(interleaved)
    assert "off by" in check_gqa_decode(unscaled)
    assert "shape" in check_gqa_decode(lambda q, k, v, scale: q[:1])


def test_kv_cache_attention_solution_passes_and_wrong_answers_fail():
    assert check_kv_cache_attention(kv_cache_attention).startswith("PASS")

    def unwritten(cache, x, project, scale):
        raise NotImplementedError

    def recomputes(cache, x, project, scale):  # right answers, without a cache: every step projects every token
        cache["xs"] = torch.cat([cache["xs"], x[None]]) if cache else x[None]
        q, k, v = project(cache["xs"])
        return torch.softmax(k @ q[-1] * scale, dim=0) @ v

    def forgets(cache, x, project, scale):  # attends to the new token alone
        return kv_cache_attention({}, x, project, scale)

    def unscaled(cache, x, project, scale):
        return kv_cache_attention(cache, x, project, 1.0)

    assert check_kv_cache_attention(unwritten).startswith("not written yet")
    assert "recomputed" in check_kv_cache_attention(recomputes)
    assert "alone" in check_kv_cache_attention(forgets)
    assert "off by" in check_kv_cache_attention(unscaled)


def test_generated_ids_solution_passes():
    assert check_generated_ids(get_generated_ids).startswith("PASS")


def test_generated_ids_unwritten_says_so():
    def unwritten(scheduler, request_id):
        raise NotImplementedError

    assert check_generated_ids(unwritten).startswith("not written yet")


def test_generated_ids_live_list_fails():
    # the private reference itself, the "before" of notebook 06: right values, but the scheduler's own list
    def live(scheduler, request_id):
        return scheduler._requests[request_id].output_token_ids

    assert "return a copy" in check_generated_ids(live)


def test_generated_ids_wrong_answers_fail():
    def first_request(scheduler, request_id):  # the id ignored: whichever request comes first
        return list(next(iter(scheduler._requests.values())).output_token_ids)

    def by_position(scheduler, request_id):  # the id taken for a position in the running list
        return list(scheduler._running[request_id % len(scheduler._running)].output_token_ids)

    def with_prompt(scheduler, request_id):  # a new list, but the prompt's ids with the output's
        seq = scheduler._requests[request_id]
        return seq.prompt_token_ids + seq.output_token_ids

    def as_tuple(scheduler, request_id):
        return tuple(scheduler._requests[request_id].output_token_ids)

    assert "look the request up by its id" in check_generated_ids(first_request)
    assert "look the request up by its id" in check_generated_ids(by_position)
    assert "came with its prompt" in check_generated_ids(with_prompt)
    assert "expected a list" in check_generated_ids(as_tuple)


def test_generated_ids_stale_copy_fails():
    kept: dict[int, list[int]] = {}

    def remembered(scheduler, request_id):  # a copy taken once, then handed out again
        if request_id not in kept:
            kept[request_id] = list(scheduler._requests[request_id].output_token_ids)
        return kept[request_id]

    assert "read the request at each call" in check_generated_ids(remembered)


def test_generated_ids_unknown_id_must_raise_key_error():
    def empty_for_unknown(scheduler, request_id):  # hides a wrong id behind an empty answer
        seq = scheduler._requests.get(request_id)
        return list(seq.output_token_ids) if seq else []

    def none_for_unknown(scheduler, request_id):  # .get() then an attribute of None: AttributeError
        return list(scheduler._requests.get(request_id).output_token_ids)

    assert "does not exist, yet it returned []" in check_generated_ids(empty_for_unknown)
    assert "raised AttributeError" in check_generated_ids(none_for_unknown)


def test_generated_ids_calling_the_schedulers_accessor_fails():
    assert "own get_generated_ids" in check_generated_ids(lambda s, rid: s.get_generated_ids(rid))


def test_graph_bucket_solution_passes_and_agrees_with_decode_graphs():
    from roseinfer.engine.cuda_graphs import DecodeGraphs, graph_buckets

    assert check_graph_bucket(graph_bucket).startswith("PASS")
    graphs = DecodeGraphs.__new__(DecodeGraphs)  # bucket_for reads only the buckets
    graphs.buckets = graph_buckets(64)
    for batch in range(1, 66):
        chosen = graph_bucket(graphs.buckets, batch)
        assert (chosen[0] if chosen else None) == graphs.bucket_for(batch)


def test_graph_bucket_unwritten_says_so():
    def unwritten(buckets, batch):
        raise NotImplementedError

    assert check_graph_bucket(unwritten).startswith("not written yet")


def test_graph_bucket_rounding_down_fails():
    def largest_below(buckets, batch):  # the largest bucket not above the batch: rows lost
        below = [b for b in buckets if b <= batch]
        return (below[-1], 0) if below else None

    assert "rows would be lost" in check_graph_bucket(largest_below)


def test_graph_bucket_too_large_fails():
    def strictly_larger(buckets, batch):  # `>` for `>=`: an exact fit goes to the next graph
        return next(((b, b - batch) for b in buckets if b > batch), None)

    def always_largest(buckets, batch):
        return (buckets[-1], buckets[-1] - batch) if batch <= buckets[-1] else None

    assert "holds it exactly" in check_graph_bucket(strictly_larger)
    assert "computed and thrown away" in check_graph_bucket(always_largest)


def test_graph_bucket_padding_count_fails():
    def batch_for_padding(buckets, batch):
        return next(((b, batch) for b in buckets if b >= batch), None)

    assert "padding rows" in check_graph_bucket(batch_for_padding)


def test_graph_bucket_past_the_largest_graph_must_be_none():
    def clamps(buckets, batch):  # the largest graph, whatever the batch: rows past it lost
        return next(((b, b - batch) for b in buckets if b >= batch), (buckets[-1], 0))

    def raises(buckets, batch):  # next() without a default
        return next((b, b - batch) for b in buckets if b >= batch)

    assert "return None" in check_graph_bucket(clamps)
    assert "raised StopIteration" in check_graph_bucket(raises)


def test_graph_bucket_wrong_shapes_fail():
    assert "expected (bucket, padded rows)" in check_graph_bucket(
        lambda buckets, batch: next((b for b in buckets if b >= batch), None))
    assert "not a captured size" in check_graph_bucket(lambda buckets, batch: (batch, 0))  # no padding at all


# --- roseinfer/bench/accessors.py (notebook 06's measurements) ---------------------------------------------


def test_split_calls_at_the_factor():
    from roseinfer.bench.accessors import split_calls

    assert split_calls([1.0, 2.0, 3.0, 3.1, 10.0], alone=2.0) == ([1.0, 2.0, 3.0], [3.1, 10.0])
    assert split_calls([], alone=2.0) == ([], [])


def test_copy_cost_and_quiet_pop_leave_no_request_behind():
    from roseinfer import InferenceEngine
    from roseinfer.bench.accessors import copy_cost_ns, quiet_pop_us

    engine = InferenceEngine.from_pretrained("gpt2-tiny", dtype="float32")
    free = engine.block_manager.num_free_blocks
    cost = copy_cost_ns(engine, [4, 2000], reps=50, repeat=2)  # 2,000: past gpt2-tiny's 1,024 positions, uncomputed
    assert sorted(cost) == [4, 2000]
    assert all(c["private_ns"] > 0 and c["accessor_ns"] > 0 for c in cost.values())
    assert quiet_pop_us(engine, lambda s, rid: s.pop_response(rid), "Hello", new_tokens=2, count=3) > 0
    assert engine.block_manager.num_free_blocks == free


def test_serve_interleaved_times_one_pop_a_request():
    from roseinfer import InferenceEngine
    from roseinfer.bench.accessors import serve_interleaved
    from roseinfer.bench.streaming import StreamingSetup

    engine = InferenceEngine.from_pretrained("gpt2-tiny", dtype="float32")
    setup = StreamingSetup(num_requests=2, prompt="Hello", pretok=True, max_new_tokens=2, stop_on_eos=False)
    runs, calls = serve_interleaved(engine, ["private-state", "current"], setup, repeats=2)
    assert {v: len(r) for v, r in runs.items()} == {"private-state": 2, "current": 2}
    assert {v: len(c) for v, c in calls.items()} == {"private-state": 4, "current": 4}  # 2 runs x 2 requests
    assert all(r["tok_s"] > 0 and r["pop_median_us"] > 0 for rs in runs.values() for r in rs)


def test_plot_accessors_draws_three_panels():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from roseinfer.bench.accessors import plot_accessors

    names = {"private-state": "private state", "current": "public accessors"}
    cost = {16: {"private_ns": 40.0, "accessor_ns": 180.0}, 1000: {"private_ns": 42.0, "accessor_ns": 1400.0}}
    calls = {"private-state": [1.0, 2.0], "current": [2.0, 9.0]}
    runs = {v: [{"tok_s": 3000.0}, {"tok_s": 3100.0}] for v in names}
    fig = plot_accessors(cost, calls, 1.9, runs, names, "2 streams x 2 tokens")
    try:
        assert len(fig.axes) == 3
        assert [t.get_text() for t in fig.axes[2].get_xticklabels()] == list(names.values())
    finally:
        plt.close(fig)


# --- notebook 07: the worker's lookup, one lock per step ---------------------------------------------------------


def _step_record(stream, token, finished):
    from roseinfer.server.manager import StepRecord

    return StepRecord(stream, token, finished)


def test_collect_step_records_solution_and_engine_pass():
    from roseinfer.bench.exercises import check_collect_step_records
    from roseinfer.bench.solutions import collect_step_records
    from roseinfer.server.manager import SchedulerManager

    assert check_collect_step_records(collect_step_records).startswith("PASS")
    assert check_collect_step_records(SchedulerManager._collect_step_records).startswith("PASS")


def test_collect_step_records_unwritten_says_so():
    from roseinfer.bench.exercises import check_collect_step_records

    def unwritten(self, step_tokens, finished):
        raise NotImplementedError

    assert check_collect_step_records(unwritten).startswith("not written yet")


def test_collect_step_records_lock_per_request_fails():
    from roseinfer.bench.exercises import check_collect_step_records
    from roseinfer.history.lock_per_token import LockPerTokenManager

    # the "before" of notebook 07, as the engine kept it: one acquisition per request with news
    assert "take the lock once" in check_collect_step_records(LockPerTokenManager._collect_step_records)


def test_collect_step_records_no_lock_fails():
    from roseinfer.bench.exercises import check_collect_step_records

    def unlocked(self, step_tokens, finished):
        done = set(finished)
        streams = {rid: self._streams.pop(rid, None) if rid in done else self._streams.get(rid)
                   for rid in step_tokens.keys() | done}
        return [_step_record(s, step_tokens.get(rid), rid in done) for rid, s in streams.items() if s is not None]

    def lock_then_read_outside(self, step_tokens, finished):  # takes the lock once, for nothing
        with self._lock:
            pass
        return unlocked(self, step_tokens, finished)

    assert "without holding self._lock" in check_collect_step_records(unlocked)
    assert "without holding self._lock" in check_collect_step_records(lock_then_read_outside)


def test_collect_step_records_delivering_inside_the_lock_fails():
    from roseinfer.bench.exercises import check_collect_step_records
    from roseinfer.bench.solutions import collect_step_records

    def delivers_inside(self, step_tokens, finished):  # detokenizes and queues text while the handlers wait
        done = set(finished)
        records = []
        with self._lock:
            for rid in step_tokens.keys() | done:
                stream = self._streams.pop(rid, None) if rid in done else self._streams.get(rid)
                if stream is not None:
                    if rid in step_tokens:
                        stream.on_token(step_tokens[rid], 0.0)
                    records.append(_step_record(stream, step_tokens.get(rid), rid in done))
        return records

    def delivers_after(self, step_tokens, finished):  # outside the lock, but _deliver would hand over twice
        records = collect_step_records(self, step_tokens, finished)
        for r in records:
            if r.token is not None:
                r.stream.on_token(r.token, 0.0)
        return records

    assert "with the lock held" in check_collect_step_records(delivers_inside)
    assert "delivered request" in check_collect_step_records(delivers_after)
    assert "with the lock held" not in check_collect_step_records(delivers_after)


def test_collect_step_records_missing_a_finished_request_fails():
    from roseinfer.bench.exercises import check_collect_step_records

    def tokens_only(self, step_tokens, finished):  # a request that finished without a token is never looked up
        done = set(finished)
        records = []
        with self._lock:
            for rid in step_tokens:
                stream = self._streams.pop(rid, None) if rid in done else self._streams.get(rid)
                if stream is not None:
                    records.append(_step_record(stream, step_tokens[rid], rid in done))
        return records

    assert "request 20 had news this step and got no record" in check_collect_step_records(tokens_only)


def test_collect_step_records_finished_stream_not_popped_fails():
    from roseinfer.bench.exercises import check_collect_step_records

    def never_pops(self, step_tokens, finished):
        done = set(finished)
        records = []
        with self._lock:
            for rid in step_tokens.keys() | done:
                stream = self._streams.get(rid)
                if stream is not None:
                    records.append(_step_record(stream, step_tokens.get(rid), rid in done))
        return records

    assert "pop the finished" in check_collect_step_records(never_pops)


def test_collect_step_records_key_error_on_an_aborted_request_fails():
    from roseinfer.bench.exercises import check_collect_step_records

    def indexes(self, step_tokens, finished):  # self._streams[rid]: the aborted request 99 has no stream
        done = set(finished)
        with self._lock:
            return [_step_record(self._streams.pop(rid) if rid in done else self._streams[rid], step_tokens.get(rid),
                                 rid in done) for rid in step_tokens.keys() | done]

    def keeps_aborted(self, step_tokens, finished):  # no KeyError, but a record with no stream
        done = set(finished)
        with self._lock:
            return [_step_record(self._streams.pop(rid, None) if rid in done else self._streams.get(rid),
                                 step_tokens.get(rid), rid in done) for rid in step_tokens.keys() | done]

    assert "KeyError for request" in check_collect_step_records(indexes)
    assert "a record with no stream" in check_collect_step_records(keeps_aborted)


def test_collect_step_records_wrong_records_fail():
    from roseinfer.bench.exercises import check_collect_step_records
    from roseinfer.bench.solutions import collect_step_records

    def twice(self, step_tokens, finished):  # tokens, then the finished again: request 7 looked up twice
        with self._lock:
            records = [_step_record(self._streams.get(rid), tok, False) for rid, tok in step_tokens.items()
                       if self._streams.get(rid) is not None]
            records += [_step_record(s, None, True) for s in (self._streams.pop(rid, None) for rid in finished) if s]
        return records

    def flags_wrong(self, step_tokens, finished):
        return [_step_record(r.stream, r.token, False) for r in collect_step_records(self, step_tokens, finished)]

    def left_locked(self, step_tokens, finished):
        self._lock.acquire()
        return []

    assert "got 2 records" in check_collect_step_records(twice)
    assert "finished False" in check_collect_step_records(flags_wrong)
    assert "still held" in check_collect_step_records(left_locked)
    def no_list(self, step_tokens, finished):
        with self._lock:
            return None

    assert "expected a list" in check_collect_step_records(no_list)


# --- roseinfer/bench/lock_lookups.py (notebook 07's measurements) ------------------------------------------------


def test_lock_lookups_count_and_time_both_variants():
    from roseinfer import InferenceEngine
    from roseinfer.bench.lock_lookups import acquisitions_per_step, lookup_alone, uncontended_lock_ns

    engine = InferenceEngine.from_pretrained("gpt2-tiny", dtype="float32")
    # 32 tokens a request (the default): the first still decode when the last arrive, even on a slow machine
    after = acquisitions_per_step(engine, "current", batch=3)
    before = acquisitions_per_step(engine, "lock-per-token", batch=3)
    assert after and all(locks == 1 for locks, _ in after)
    assert before and all(locks == news for locks, news in before) and max(n for _, n in before) == 3
    assert uncontended_lock_ns(n=1000, repeat=2) > 0
    alone = lookup_alone(engine, ["lock-per-token", "current"], batch=3, rounds=2, calls=10)
    assert {v: len(t) for v, t in alone.items()} == {"lock-per-token": 2, "current": 2}


def test_serve_loads_and_seed_runs_keep_the_batch():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from roseinfer import InferenceEngine
    from roseinfer.bench.lock_lookups import plot_lookups, seed_runs, serve_loads
    from roseinfer.bench.streaming import StreamingSetup

    engine = InferenceEngine.from_pretrained("gpt2-tiny", dtype="float32")
    names = {"lock-per-token": "lock per token", "current": "lock per step"}
    loads = {"no handlers": {}, "2 handlers": dict(threads=2, rate_per_s=2000)}
    runs = serve_loads(engine, names, loads, batch=2, new_tokens=3, prompt_ids=[1, 2], repeats=2)
    assert all(len(runs[load][v]) == 2 for load in loads for v in names)
    assert all(r["steps"] >= 2 and r["tpot_ms"] > 0 for load in loads for v in names for r in runs[load][v])
    assert all(r["handler_req_s"] == 0 for r in runs["no handlers"]["current"])
    assert all(r["handler_req_s"] > 0 for r in runs["2 handlers"]["current"])
    setup = StreamingSetup(num_requests=2, prompt="Hello", pretok=True, max_new_tokens=2, stop_on_eos=False)
    seed = seed_runs(engine, names, setup, repeats=2)
    assert all(len(seed[v]) == 2 and seed[v][0]["ttft_p50_ms"] > 0 for v in names)
    fig = plot_lookups({v: [10.0, 11.0] for v in names}, runs, seed, {"ttft_p50_ms": (9.2, 7.6)}, names, 3.0)
    try:
        assert len(fig.axes) == 3
    finally:
        plt.close(fig)


# --- notebook 08: one sequence's decode attention through the block table ---------------------------------------


def _paged_decode_with(mistake: str = ""):
    """notebook 08's solution with one mistake a learner makes, by name ("" for none)."""

    def attend(q, k_cache, v_cache, block_table, context_len, scale):
        block_size = k_cache.shape[1]
        heads, dim = q.shape
        running_max = torch.full((heads,), float("-inf"), dtype=torch.float64 if mistake == "no max" else None)
        total, acc = torch.zeros(heads, dtype=torch.float64), torch.zeros(heads, dim, dtype=torch.float64)
        blocks = (len(block_table) if mistake == "whole table" else context_len // block_size if mistake == "floor"
                  else -(-context_len // block_size))
        for j in range(blocks):
            start = j * block_size
            block = j if mistake == "logical block" else int(block_table[j])
            n = block_size if mistake in ("whole last block", "whole table") else min(block_size, context_len - start)
            if mistake == "swapped":
                slots = [(int(block_table[t % block_size]), t // block_size) for t in range(start, start + n)]
                k = torch.stack([k_cache[b, s] for b, s in slots]).double()
                v = torch.stack([v_cache[b, s] for b, s in slots]).double()
            else:
                k, v = k_cache[block, :n].double(), v_cache[block, :n].double()
            if mistake == "keys of the next head":
                k = k.roll(1, dims=1)
            if mistake == "values of the next head":
                v = v.roll(1, dims=1)
            if mistake == "heads summed":
                scores = torch.einsum("hd,nhd->n", q.double(), k)[None].expand(heads, -1) * scale
            else:
                scores = torch.einsum("hd,nhd->hn", q.double(), k) * (1.0 if mistake == "no scale" else scale)
            if mistake == "no max":
                p = torch.exp(scores)
                total, acc = total + p.sum(dim=1), acc + torch.einsum("hn,nhd->hd", p, v)
                continue
            new_max = torch.maximum(running_max, scores.max(dim=1).values)
            rescale = (torch.ones(heads, dtype=torch.float64) if mistake == "no rescale"
                       else torch.exp(running_max - new_max))
            p = torch.exp(scores - new_max[:, None])
            total = total * rescale + p.sum(dim=1)
            acc = acc * rescale[:, None] + torch.einsum("hn,nhd->hd", p, v)
            running_max = new_max
        return acc if mistake == "not normalized" else acc / total[:, None]

    return attend


def test_paged_decode_solution_and_engine_kernels_pass():
    from roseinfer.attention.base import AttentionMetadata
    from roseinfer.attention.cpu import CpuPagedAttention
    from roseinfer.bench.exercises import check_paged_decode
    from roseinfer.bench.solutions import paged_decode

    assert check_paged_decode(paged_decode).startswith("PASS")
    assert check_paged_decode(_paged_decode_with()).startswith("PASS")  # the test's own variant, mistake-free
    fused = CpuPagedAttention()
    if fused.fused:  # the engine's C kernel, one sequence at a time, passes the same check

        def c_kernel(q, k_cache, v_cache, table, n, scale):
            lens, starts = torch.tensor([n], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
            meta = AttentionMetadata(torch.full((1,), -1), table[None].contiguous(), lens, starts, 1, n)
            return fused.decode(q[None].contiguous(), k_cache, v_cache, meta, scale)[0]

        assert check_paged_decode(c_kernel).startswith("PASS")


def test_paged_decode_unwritten_says_so():
    from roseinfer.bench.exercises import check_paged_decode

    def unwritten(q, k_cache, v_cache, block_table, context_len, scale):
        raise NotImplementedError

    assert check_paged_decode(unwritten).startswith("not written yet")


@pytest.mark.parametrize("mistake, said", [
    ("logical block", "the physical block of token t is block_table[t // block_size]"),
    ("swapped", "block/slot arithmetic"),
    ("whole last block", "past the context"),
    ("whole table", "past the context"),
    ("floor", "ceil(context_len / block_size)"),
    ("no max", "overflow"),
    ("keys of the next head", "mixing up heads: query head"),
    ("values of the next head", "mixing up heads: head"),
    ("heads summed", "mixing up heads: every head got the same weights"),
    ("no rescale", "not rescaled when the running maximum grew"),
    ("not normalized", "divide the accumulator"),
    ("no scale", "without the scale"),
])
def test_paged_decode_mistakes_are_named(mistake, said):
    from roseinfer.bench.exercises import check_paged_decode

    verdict = check_paged_decode(_paged_decode_with(mistake))
    assert verdict.startswith("FAIL") and said in verdict, verdict


def _frame_stream_with(mistake):
    import json

    def frame(base, pieces, finish_reason):
        def event(data):
            if mistake == "raw text":
                line = data if isinstance(data, str) else data["choices"][0]["text"]
                return f"data: {line}\n\n"
            body = data if isinstance(data, str) else json.dumps(data)
            if mistake == "quoted done" and data == "[DONE]":
                body = json.dumps(data)
            prefix = "" if mistake == "no data prefix" else "data: "
            return prefix + body + ("\n" if mistake == "no blank line" else "\n\n")

        def chunk(text, reason, first):
            envelope = base if first or mistake != "envelope once" else {}
            return {**envelope, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}

        reason = finish_reason if mistake == "reason on every chunk" else None
        out = "".join(event(chunk(p, reason, i == 0)) for i, p in enumerate(pieces))
        if mistake != "no final chunk":
            out += event(chunk("", finish_reason, False))
        return out + ("" if mistake == "no done" else event("[DONE]"))

    return frame


def test_frame_stream_solution_passes():
    from roseinfer.bench.exercises import check_frame_stream
    from roseinfer.bench.solutions import frame_stream

    assert check_frame_stream(frame_stream).startswith("PASS")


def test_frame_stream_check_passes_the_servers_own_framing():
    from roseinfer.bench.exercises import check_frame_stream
    from roseinfer.server.sse import sse

    def server_frame(base, pieces, finish_reason):
        def chunk(text, reason):
            return {**base, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}

        return "".join(sse(chunk(p, None)) for p in pieces) + sse(chunk("", finish_reason)) + sse("[DONE]")

    assert check_frame_stream(server_frame).startswith("PASS")


def test_frame_stream_unwritten_says_so():
    from roseinfer.bench.exercises import check_frame_stream

    def unwritten(base, pieces, finish_reason):
        raise NotImplementedError

    assert check_frame_stream(unwritten).startswith("not written yet")


@pytest.mark.parametrize("mistake, said", [
    ("raw text", "raw newline"),
    ("no blank line", "blank line"),
    ("no data prefix", "starting with 'data: '"),
    ("quoted done", "not as a JSON string"),
    ("no done", "must end with `data: [DONE]`"),
    ("no final chunk", "carries the finish reason"),
    ("reason on every chunk", "set only on the last"),
    ("envelope once", "carries the envelope"),
])
def test_frame_stream_mistakes_are_named(mistake, said):
    from roseinfer.bench.exercises import check_frame_stream

    verdict = check_frame_stream(_frame_stream_with(mistake))
    assert verdict.startswith("FAIL") and said in verdict, verdict


# --- notebook 02: packing a step's sequences into one flat batch -------------------------------------------------


def _pack_batch_with(mistake: str = ""):
    """notebook 02's solution with one mistake a learner makes, by name ("" for none)."""

    def pack(seqs):
        if mistake == "reordered":  # longest first, every field built in that order
            seqs = sorted(seqs, key=lambda s: -len(s[0]))
        longest = max(len(ids) for ids, _ in seqs)
        input_ids, positions, offsets, context_lens, last_rows = [], [], [0], [], []
        for ids, start in seqs:
            n = len(ids)
            input_ids += ids + [0] * (longest - n) if mistake == "padded" else ids
            first = {"positions from 0": 0, "positions + 1": start + 1, "positions run on": len(positions)}
            positions += range(first.get(mistake, start), first.get(mistake, start) + n)
            offsets.append(offsets[-1] + n)
            context_lens.append({"new tokens only": n, "cache only": start, "context - 1": start + n - 1}
                                .get(mistake, start + n))
            last_rows.append({"first token sampled": offsets[-2], "index within the sequence": n - 1,
                              "next offset": offsets[-1]}.get(mistake, offsets[-1] - 1))
        if mistake == "rows":
            input_ids = [ids + [0] * (longest - len(ids)) for ids, _ in seqs]
        offsets = {"offsets without 0": offsets[1:], "lengths as offsets": [len(ids) for ids, _ in seqs],
                   "offsets - 1": [0] + [o - 1 for o in offsets[1:]]}.get(mistake, offsets)
        out = (input_ids, positions, offsets, context_lens, last_rows)
        if mistake == "tensors":
            return tuple(torch.tensor(x) for x in out)
        return out[:4] if mistake == "four" else out

    return pack


def test_pack_batch_solution_passes():
    from roseinfer.bench.exercises import check_pack_batch
    from roseinfer.bench.solutions import pack_batch

    assert check_pack_batch(pack_batch).startswith("PASS")
    assert check_pack_batch(_pack_batch_with()).startswith("PASS")  # the test's own variant, mistake-free
    assert check_pack_batch(_pack_batch_with("tensors")).startswith("PASS")  # tensors are fine too


def test_pack_batch_unwritten_says_so():
    from roseinfer.bench.exercises import check_pack_batch

    def unwritten(seqs):
        raise NotImplementedError

    assert check_pack_batch(unwritten).startswith("not written yet")


@pytest.mark.parametrize("mistake, said", [
    ("padded", "padded:"),
    ("rows", "one row per sequence is padding"),
    ("reordered", "sequences reordered"),
    ("positions from 0", "positions restart at 0"),
    ("positions run on", "positions run on across sequences"),
    ("positions + 1", "the first new token's position is start_pos"),
    ("offsets without 0", "there are B + 1"),
    ("lengths as offsets", "these are the sequences' lengths"),
    ("offsets - 1", "offsets off by one"),
    ("new tokens only", "the new tokens only"),
    ("cache only", "the cache before this step"),
    ("context - 1", "off by one: a sequence attends to start_pos + its new tokens"),
    ("first token sampled", "sampled the first token"),
    ("index within the sequence", "indices within each sequence"),
    ("next offset", "is the next sequence's first token"),
    ("four", "expected a tuple of five"),
])
def test_pack_batch_mistakes_are_named(mistake, said):
    from roseinfer.bench.exercises import check_pack_batch

    verdict = check_pack_batch(_pack_batch_with(mistake))
    assert verdict.startswith("FAIL") and said in verdict, verdict


# --- notebook 10: the prefix cache's lookup of a prompt's cached blocks -----------------------------------------


def _prefix_blocks_with(mistake: str = ""):
    """notebook 10's solution with one mistake a learner makes, by name ("" for none)."""
    from roseinfer.engine.block_manager import chain_hash

    def match(token_ids, block_size, cached):
        usable = len(token_ids) - (0 if mistake == "last token" else 1)
        end = usable if mistake == "partial" else usable - block_size + 1
        if mistake == "one short":
            end -= block_size
        blocks, parent = [], None
        for start in range(0, max(end, 0), block_size):
            chunk = token_ids[start : min(start + block_size, usable)]
            key = chain_hash(None if mistake == "unchained" else parent, chunk)
            if key not in cached:
                if mistake == "skips a miss":  # goes on, the parent left as it was
                    continue
                if mistake == "past a miss":  # goes on, chaining through the missing block
                    parent = key
                    continue
                break
            blocks.append({"keys": key, "positions": start // block_size}.get(mistake, cached[key]))
            parent = key
        return set(blocks) if mistake == "set" else blocks

    return match


def test_prefix_blocks_solution_passes():
    from roseinfer.bench.exercises import check_prefix_blocks
    from roseinfer.bench.solutions import prefix_blocks

    assert check_prefix_blocks(prefix_blocks).startswith("PASS")
    assert check_prefix_blocks(_prefix_blocks_with()).startswith("PASS")  # the test's own variant, mistake-free


def test_prefix_blocks_solution_agrees_with_the_block_manager():
    import random

    from roseinfer.bench.solutions import prefix_blocks
    from roseinfer.engine.block_manager import BlockManager, blocks_for, chain_hash

    rng, size = random.Random(0), 2
    manager = BlockManager(12, size)  # a small pool: later prompts evict earlier prompts' cached blocks
    hits = 0
    for _ in range(300):
        prompt = [rng.randrange(3) for _ in range(rng.randrange(1, 12))]  # 3 token ids: prefixes repeat
        found, hashes = manager.match_prefix(prompt, len(prompt) - 1)  # as OnlineScheduler._admit asks
        assert prefix_blocks(prompt, size, dict(manager._block_of_hash)) == found, prompt
        hits += bool(found)
        # admit it as _admit does, register its full blocks as _register_full_blocks does, then finish it
        table = found + manager.allocate(blocks_for(len(prompt), size) - len(found))
        manager.share(found)
        parent = hashes[-1] if hashes else None
        for j in range(len(found), len(prompt) // size):
            tokens = prompt[j * size : (j + 1) * size]
            parent = chain_hash(parent, tokens)
            manager.register(table[j], parent, tokens)
        manager.free(table)
    assert hits > 50  # the lookup was exercised: 98 of these 300 prompts found cached blocks


def test_prefix_blocks_unwritten_says_so():
    from roseinfer.bench.exercises import check_prefix_blocks

    def unwritten(token_ids, block_size, cached):
        raise NotImplementedError

    assert check_prefix_blocks(unwritten).startswith("not written yet")


@pytest.mark.parametrize("mistake, said", [
    ("unchained", "hashing a block without its parent"),
    ("skips a miss", "not stopping at the first miss"),
    ("past a miss", "not stopping at the first miss"),
    ("partial", "matching a partial last block"),
    ("last token", "leave its last token out of the lookup"),
    ("one short", "stopped after 3 block(s)"),
    ("keys", "it returned keys"),
    ("positions", "the blocks' positions in the prompt"),
    ("set", "expected a list of physical block ids"),
])
def test_prefix_blocks_mistakes_are_named(mistake, said):
    from roseinfer.bench.exercises import check_prefix_blocks

    verdict = check_prefix_blocks(_prefix_blocks_with(mistake))
    assert verdict.startswith("FAIL") and said in verdict, verdict


# --- notebook 03: the continuous-batching decision between two steps --------------------------------------------


def _schedule_step_with(mistake: str = ""):
    """notebook 03's solution with one mistake a learner makes, by name ("" for none)."""

    def schedule_step(running, waiting, max_batch_size):
        done = 1 if mistake == "finishes a token early" else 0
        finished = [] if mistake == "never finishes" else [rid for rid, left in running if left <= done]
        busy = len(running) if mistake == "late" else len(running) - len(finished)
        free = max_batch_size - busy + (1 if mistake == "one too many" else 0)
        queue = {"sorted": sorted(waiting), "lifo": waiting[::-1]}.get(mistake, waiting)
        admitted = list(queue[: max(free, 0)])
        if mistake == "static" and busy:
            admitted = []
        if mistake == "no limit":
            admitted = list(waiting)
        if mistake == "whole batch":  # the new batch, not the newcomers
            admitted = [rid for rid, _ in running if rid not in finished] + admitted
        if mistake == "finished twice":
            finished = finished * 2
        if mistake == "admitted only":
            return admitted
        return finished, admitted

    return schedule_step


def _engine_schedule_decisions(max_batch_size: int) -> list[tuple[list[int], list[int]]]:
    """The OnlineScheduler, stepped over check_schedule_step's stream with a stand-in model: at every step, the
    requests that finished in the step before and the ones it admits (first scheduled) in this one."""
    from roseinfer.bench.exercises import _schedule_stream
    from roseinfer.config import SchedulerLimits
    from roseinfer.engine.block_manager import BlockManager
    from roseinfer.engine.scheduler import OnlineScheduler
    from roseinfer.engine.sequence import Request
    from roseinfer.sampling import SamplingParams

    stream = _schedule_stream()
    limits = SchedulerLimits(max_batch_size=max_batch_size, enable_prefix_cache=False)
    scheduler = OnlineScheduler(BlockManager(256, 4), limits, frozenset())
    decisions, started, finished, i, step = [], set(), [], 0, 0
    while i < len(stream) or scheduler.has_unfinished():
        while i < len(stream) and stream[i][0] <= step:
            _, rid, n = stream[i]
            scheduler.add_request(Request([1, 2, 3], SamplingParams(max_new_tokens=n, stop_on_eos=False)), rid)
            i += 1
        batch = scheduler.schedule()
        admitted = [seq.request_id for seq, _ in batch.scheduled if seq.request_id not in started]
        started.update(admitted)
        decisions.append((sorted(finished), admitted))
        finished = scheduler.update(batch, [0 if e.sample else None for e in batch.entries]) if batch else []
        step += 1
    decisions.append((sorted(finished), []))
    return decisions


def test_schedule_step_solution_passes_and_its_reference_is_the_engines():
    from roseinfer.bench.exercises import SCHEDULE_MAX_BATCH_SIZES, _schedule_states, check_schedule_step
    from roseinfer.bench.solutions import schedule_step

    assert check_schedule_step(schedule_step).startswith("PASS")
    assert check_schedule_step(_schedule_step_with()).startswith("PASS")  # the test's own variant, mistake-free
    for max_batch_size in SCHEDULE_MAX_BATCH_SIZES:  # the check's reference decides as the OnlineScheduler does
        reference = [(sorted(fin), adm) for _, _, _, fin, adm in _schedule_states(max_batch_size)]
        assert reference == _engine_schedule_decisions(max_batch_size)


def test_schedule_step_unwritten_says_so():
    from roseinfer.bench.exercises import check_schedule_step

    def unwritten(running, waiting, max_batch_size):
        raise NotImplementedError

    assert check_schedule_step(unwritten).startswith("not written yet")


@pytest.mark.parametrize("mistake, said", [
    ("static", "static batching"),
    ("late", "refilling a step late"),
    ("no limit", "exceeding max_batch_size"),
    ("one too many", "exceeding max_batch_size"),
    ("sorted", "breaking FIFO"),
    ("lifo", "breaking FIFO"),
    ("finishes a token early", "losing a request"),
    ("never finishes", "hold its slot"),
    ("whole batch", "duplicating a request: request"),
    ("finished twice", "is finished twice"),
    ("admitted only", "return a pair of lists"),
])
def test_schedule_step_mistakes_are_named(mistake, said):
    from roseinfer.bench.exercises import check_schedule_step

    verdict = check_schedule_step(_schedule_step_with(mistake))
    assert verdict.startswith("FAIL") and said in verdict, verdict


def test_schedule_step_an_error_is_reported_with_its_state():
    from roseinfer.bench.exercises import check_schedule_step
    from roseinfer.bench.solutions import schedule_step

    def peeks(running, waiting, max_batch_size):
        waiting[0]  # an empty queue has no head: IndexError
        return schedule_step(running, waiting, max_batch_size)

    verdict = check_schedule_step(peeks)
    assert verdict.startswith("FAIL") and "raised IndexError" in verdict, verdict


# --- notebook 11: a weight packed into the panels roseinfer's bf16 kernel reads ----------------------------------


def _pack_panels_with(mistake: str = ""):
    """notebook 11's solution with one mistake a learner makes, by name ("" for none)."""

    def pack(weight):
        if mistake == "transposed":
            weight = weight.T
        n, k = weight.shape
        columns = 16 if mistake == "width 16" else 32
        panels = {"extra panel": n // columns + 1, "no padding": n // columns}.get(mistake, -(-n // columns))
        if mistake == "view without padding":
            return weight.view(-1, columns, k // 2, 2).permute(0, 2, 1, 3).contiguous()
        padded = (torch.full((panels * columns, k), 7.0, dtype=weight.dtype) if mistake == "padding not zero"
                  else weight.new_zeros(panels * columns, k))
        rows = min(n, panels * columns)
        padded[:rows] = weight[:rows]
        if mistake == "reshape":
            return padded.reshape(panels, k // 2, columns, 2)
        if mistake == "no permute":
            return padded.view(panels, columns, k // 2, 2).contiguous()
        if mistake == "pair last":
            return padded.view(panels, columns, k // 2, 2).permute(0, 2, 3, 1).contiguous()
        if mistake == "halves":
            return padded.view(panels, columns, 2, k // 2).permute(0, 3, 1, 2).contiguous()
        out = padded.view(panels, columns, k // 2, 2).permute(0, 2, 1, 3)
        if mistake == "not contiguous":
            return out
        if mistake == "columns reversed":
            out = out.flip(2)
        if mistake == "fp32":
            out = out.float()
        return out.tolist() if mistake == "list" else out.contiguous()

    return pack


def test_pack_panels_solution_passes_with_and_without_the_kernel(monkeypatch):
    from roseinfer.bench.exercises import check_pack_panels
    from roseinfer.bench.solutions import pack_panels
    from roseinfer.kernels.cpu import bindings

    verdict = check_pack_panels(pack_panels)
    assert verdict.startswith("PASS"), verdict
    assert ("roseinfer's kernel, given them" in verdict) == (bindings.load_bf16_linear_kernel() is not None)
    assert check_pack_panels(_pack_panels_with()).startswith("PASS")  # the test's own variant, mistake-free
    monkeypatch.setattr(bindings, "load_bf16_linear_kernel", lambda: None)  # a CPU without AVX512-BF16
    verdict = check_pack_panels(pack_panels)
    assert verdict.startswith("PASS") and "cannot run roseinfer's bf16 kernel" in verdict, verdict


def test_pack_panels_solution_is_the_engines_packing():
    from roseinfer.bench.solutions import pack_panels
    from roseinfer.kernels.cpu.bindings import PANEL_COLUMNS, unpack_panels
    from roseinfer.kernels.cpu.bindings import pack_panels as engine_pack_panels

    gen = torch.Generator().manual_seed(1)
    for n, k in ((1, 2), (31, 6), (32, 8), (33, 768), (2304, 768)):
        weight = torch.randn(n, k, generator=gen).bfloat16()
        assert torch.equal(pack_panels(weight), engine_pack_panels(weight, PANEL_COLUMNS))
        assert torch.equal(unpack_panels(pack_panels(weight), n), weight)


def test_pack_panels_unwritten_says_so():
    from roseinfer.bench.exercises import check_pack_panels

    def unwritten(weight):
        raise NotImplementedError

    assert check_pack_panels(unwritten).startswith("not written yet")


@pytest.mark.parametrize("mistake, said", [
    ("width 16", "panels of 16 columns"),
    ("no padding", "no padding: N = 70"),
    ("view without padding", "pad the weight with zero rows"),
    ("extra panel", "an extra panel"),
    ("transposed", "transposed: it packed a [K, N] matrix"),
    ("no permute", "the permute is missing"),
    ("pair last", "puts a pair's two k values 32 apart"),
    ("reshape", "a reshape (or view) to [N/32, K/2, 32, 2] moves nothing"),
    ("halves", "pairs not interleaved"),
    ("padding not zero", "the padding is not zero"),
    ("not contiguous", "not contiguous"),
    ("fp32", "dtype torch.float32, the weight's is torch.bfloat16"),
    ("columns reversed", "packed[0, 0, 0, 0] should hold W[32p + c, 2j + t] = W[0, 0]; it holds W[31, 0]"),
    ("list", "expected a tensor"),
])
def test_pack_panels_mistakes_are_named(mistake, said):
    from roseinfer.bench.exercises import check_pack_panels

    verdict = check_pack_panels(_pack_panels_with(mistake))
    assert verdict.startswith("FAIL") and said in verdict, verdict


# --- notebook 04: one pass of the scheduler manager's worker ------------------------------------------------------


def _worker_pass_with(mistake: str = ""):
    """notebook 04's solution with one mistake a learner makes, by name ("" for none)."""
    import queue

    def worker_pass(inbox, scheduler, outputs):
        stale = scheduler.pop_finished_ids() if mistake == "ends a pass late" else []  # before the step
        if mistake == "steps before taking" and scheduler.has_unfinished():
            route(scheduler, outputs, None, stale)
        last = None
        while True:
            try:
                request_id, request, last = inbox.get() if mistake == "waits" else inbox.get_nowait()
            except queue.Empty:
                if mistake == "empty escapes":
                    raise
                break
            if mistake == "scheduler ids":
                scheduler.add_request(request)  # the id it returns is dropped
            elif mistake != "not added":
                scheduler.add_request(request, request_id=request_id)
            outputs[request_id] = last
            if mistake == "one a pass":
                break
        if mistake != "steps before taking" and (mistake == "steps idle" or scheduler.has_unfinished()):
            route(scheduler, outputs, last, stale)

    def route(scheduler, outputs, last, stale):
        tokens = scheduler.step()
        if mistake == "steps twice":
            tokens.update(scheduler.step())
        finished = stale if mistake == "ends a pass late" else scheduler.pop_finished_ids()
        if mistake == "end before the last token":
            for request_id in finished:
                outputs[request_id].put(None)
        if mistake == "positional":
            for out, token in zip(outputs.values(), tokens.values()):
                out.put(token)
        for request_id, token in tokens.items() if mistake != "positional" else ():
            if mistake == "drops the last token" and request_id in finished:
                continue
            (last if mistake == "last queue" else outputs[request_id]).put(token)
            if mistake == "ends twice" and request_id in finished:
                outputs[request_id].put(None)
        if mistake == "ends on no token":
            for request_id, out in outputs.items():
                if request_id not in tokens:
                    out.put(None)
        for request_id in finished if mistake != "never ends" else ():
            out = outputs[request_id] if mistake == "keeps finished" else outputs.pop(request_id)
            if mistake != "end before the last token":
                out.put(None)

    return worker_pass


def test_worker_pass_solution_passes():
    from roseinfer.bench.exercises import check_worker_pass
    from roseinfer.bench.solutions import worker_pass

    assert check_worker_pass(worker_pass).startswith("PASS")
    assert check_worker_pass(_worker_pass_with()).startswith("PASS")  # the test's own variant, mistake-free


def test_worker_pass_unwritten_says_so():
    from roseinfer.bench.exercises import check_worker_pass

    def unwritten(inbox, scheduler, outputs):
        raise NotImplementedError

    assert check_worker_pass(unwritten).startswith("not written yet")


@pytest.mark.parametrize("mistake, said", [
    ("positional", "tokens routed to the wrong request"),
    ("last queue", "tokens routed to the wrong request"),
    ("scheduler ids", "the scheduler numbered the request itself"),
    ("never ends", "a finished request never signalled"),
    ("ends twice", "an end signalled 2 times"),
    ("one a pass", "submissions pile up"),
    ("steps idle", "stepping with nothing to do"),
    ("drops the last token", "came in the step that finished the request: put the token, then the end"),
    ("end before the last token", "after its end"),
    ("ends a pass late", "its end came at pass"),
    ("ends on no token", "request 12 was ended at pass 1 but had not finished"),
    ("waits", "waited on an empty inbox"),
    ("empty escapes", "queue.Empty escaped"),
    ("not added", "added to the scheduler"),
    ("steps before taking", "did not step"),
    ("steps twice", "stepped 2 times"),
    ("keeps finished", "still in outputs"),
])
def test_worker_pass_mistakes_are_named(mistake, said):
    from roseinfer.bench.exercises import check_worker_pass

    verdict = check_worker_pass(_worker_pass_with(mistake))
    assert verdict.startswith("FAIL") and said in verdict, verdict


def test_worker_pass_solution_routes_as_the_engines_manager():
    """SchedulerManager's own worker loop, run in this thread over the check's script and stand-in scheduler (one
    loop iteration a pass), gives every request the same tokens and end, at the same passes, as the solution."""
    import threading
    from types import SimpleNamespace

    from roseinfer.bench.exercises import (
        WORKER_SCRIPT,
        _run_worker_script,
        _ScriptedRequest,
        _ScriptedScheduler,
    )
    from roseinfer.bench.solutions import worker_pass
    from roseinfer.server.manager import SchedulerManager

    class Scheduler(_ScriptedScheduler):
        def pop_response(self, request_id):  # what the manager reads of a finished request
            return SimpleNamespace(finish_reason="length", metrics=SimpleNamespace(first_scheduled_time=0.0))

    got: dict[int, list] = {}
    scheduler = Scheduler()

    class Stream:  # a RequestStream stand-in: notes what the worker delivers, and at which pass
        stopped = False

        def __init__(self, request_id, tokens, prefill_steps):
            self.request_id, self.request = request_id, _ScriptedRequest(request_id, tokens, prefill_steps)
            self.timings = SimpleNamespace(scheduled=None, queued=None)
            got[request_id] = []

        def on_token(self, token, now):
            got[self.request_id].append((scheduler.pass_index, token))

        def on_finish(self, finish_reason, now):
            got[self.request_id].append((scheduler.pass_index, None))

    class ScriptedManager(SchedulerManager):
        def _start_worker(self):  # no thread: the test runs the loop
            self._worker = threading.current_thread()

        def _scheduler_stats(self):
            return {}

        def _publish_stats(self):
            pass

        def _take_new_work(self):  # an iteration of the loop is a pass: submit its requests, as handlers do
            index = scheduler.pass_index = self.num_passes
            self.num_passes += 1
            if index == len(WORKER_SCRIPT):
                self._stopping = True
            for rid, tokens, prefill_steps in WORKER_SCRIPT[index] if index < len(WORKER_SCRIPT) else ():
                stream = self._streams[rid] = Stream(rid, tokens, prefill_steps)  # as _register does
                self._queue(stream)
            return super()._take_new_work()

        def _wait_for_work(self):  # idle: the next iteration is the next pass
            pass

    engine = SimpleNamespace(new_scheduler=lambda **limits: scheduler, step=lambda s: s.step(),
                             tokenizer=SimpleNamespace(token_bytes=lambda token: b""))
    ScriptedManager.num_passes = 0
    manager = ScriptedManager(engine)
    manager._worker_loop()
    assert manager.error is None and manager.num_passes == len(WORKER_SCRIPT) + 1
    solution_got, solution_scheduler, _ = _run_worker_script(worker_pass)
    assert got == solution_got
    assert manager.num_idle_wakeups == len(WORKER_SCRIPT) - solution_scheduler.passes_stepped == 3


# --- notebook 05: the idle worker sleeps on the wake-up event -----------------------------------------------------


def _worker_idle_with(mistake: str = ""):
    """notebook 05's solution with one mistake a learner makes, by name ("" for none)."""
    import time

    def idle(self):
        work = (lambda: self._pending) if mistake == "pending only" else (
            lambda: self._pending or self._aborts or self._stopping)
        if mistake == "clear first":  # right too: any set() after this clear survives, and the check sees the rest
            self._wakeup.clear()
        if mistake == "check outside the lock" and work():
            return
        if mistake in ("spin", "return at once"):
            while not work():
                if mistake == "return at once":  # the worker loop calls it again at once: a spin as well
                    return
            return
        if mistake == "poll":  # the retired worker's way, looking under the lock
            while True:
                with self._lock:
                    if work():
                        return
                time.sleep(0.005)
        with self._lock:
            if mistake != "check outside the lock" and work():
                return
            if mistake in ("", "pending only", "check outside the lock", "wait under the lock", "wait with a timeout"):
                self._wakeup.clear()
            if mistake == "wait under the lock":
                self._wakeup.wait()
                return
        if mistake == "clear after the check":  # the lost wake-up of notebook 05
            self._wakeup.clear()
        self._wakeup.wait(0.005 if mistake == "wait with a timeout" else None)
        if mistake == "clear after the wait":
            self._wakeup.clear()

    return idle


def _no_check_thread_left() -> bool:
    import threading

    return not [t for t in threading.enumerate() if t.name == "check_worker_idle" and t.is_alive()]


def test_worker_idle_solution_and_engine_pass():
    from roseinfer.bench.exercises import check_worker_idle
    from roseinfer.bench.solutions import worker_idle
    from roseinfer.server.manager import SchedulerManager

    for idle in (worker_idle, SchedulerManager._idle, _worker_idle_with(), _worker_idle_with("clear first")):
        verdict = check_worker_idle(idle)
        assert verdict.startswith("PASS"), verdict
    assert _no_check_thread_left()


def test_worker_idle_unwritten_says_so():
    from roseinfer.bench.exercises import check_worker_idle

    def unwritten(self):
        raise NotImplementedError

    assert check_worker_idle(unwritten).startswith("not written yet")
    assert _no_check_thread_left()


def test_worker_idle_the_engines_earlier_workers_fail():
    from roseinfer.bench.exercises import check_worker_idle
    from roseinfer.history.clear_outside_lock import ClearOutsideLockManager
    from roseinfer.history.polling_worker import PollingWorkerManager

    lost = check_worker_idle(ClearOutsideLockManager._idle)  # notebook 05's lost wake-up, as the engine keeps it
    assert lost.startswith("FAIL: lost wake-up") and "after its release of self._lock and before its clear()" in lost
    assert check_worker_idle(PollingWorkerManager._idle).startswith("FAIL: polling")  # notebook 05's "before"
    assert _no_check_thread_left()


@pytest.mark.parametrize("mistake, said", [
    ("clear after the check", "lost wake-up"),
    ("check outside the lock", "lost wake-up"),
    ("poll", "polling"),
    ("wait with a timeout", "polling"),
    ("spin", "busy-spinning"),
    ("return at once", "busy-spinning"),
    ("never clears", "never clearing"),
    ("clear after the wait", "clearing after the wait"),
    ("pending only", "looks only at self._pending"),
    ("wait under the lock", "holding self._lock"),
])
def test_worker_idle_mistakes_are_named(mistake, said):
    import time

    from roseinfer.bench.exercises import check_worker_idle

    start = time.perf_counter()
    verdict = check_worker_idle(_worker_idle_with(mistake))
    assert verdict.startswith("FAIL") and said in verdict, verdict
    assert time.perf_counter() - start < 1.0  # the check waits tens of ms, never a wrong answer's whole nap
    assert _no_check_thread_left()
