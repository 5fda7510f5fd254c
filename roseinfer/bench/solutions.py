"""Solutions of the notebooks' exercises (roseinfer.bench.exercises checks them). Try first."""

from __future__ import annotations

import hashlib


def kv_cache_attention(cache, x, project, scale):
    """Notebook 01: project the new token alone, keep its key and value, attend over everything kept."""
    import torch

    q, k, v = project(x[None])  # [1, D] each: this token only
    if cache:
        k, v = torch.cat([cache["k"], k]), torch.cat([cache["v"], v])
    cache["k"], cache["v"] = k, v  # every token's, so far
    return torch.softmax(k @ q[0] * scale, dim=0) @ v


def prefix_router(prompt: str, replicas: list[str]) -> str:
    """Notebook 14: hash what is shared (the system prompt, before "\\nUser:"), so it always lands on one replica.
    A stable hash (not Python's `hash`, salted per process) keeps the choice across gateway restarts."""
    system = prompt.split("\nUser:")[0]
    return replicas[int(hashlib.sha256(system.encode()).hexdigest(), 16) % len(replicas)]


def gqa_decode(q, k, v, scale):
    """Notebook 12: give every KV head to its `group` consecutive query heads, then ordinary attention."""
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [tokens, heads, D]
    weights = ((k * q).sum(-1) * scale).softmax(dim=0)  # [tokens, heads]: each head's softmax over the tokens
    return (weights[..., None] * v).sum(0)


def get_generated_ids(scheduler, request_id):
    """Notebook 06: the request's output ids, copied: the caller owns the list, the scheduler keeps its own.
    `scheduler._requests[request_id]` raises KeyError for an unknown id, as the scheduler's accessors do."""
    return list(scheduler._requests[request_id].output_token_ids)


def pop_response(scheduler, request_id):
    """Notebook 06: the finished request's record, with its own copy of the generated ids; the scheduler forgets
    it. A running request raises ValueError and stays; an unknown id raises KeyError (the dict lookup)."""
    from roseinfer.engine.sequence import FinishedRequest

    seq = scheduler._requests[request_id]
    if not seq.is_finished:
        raise ValueError(f"request {request_id} is not finished")
    del scheduler._requests[request_id]
    return FinishedRequest(request_id=request_id, prompt=seq.prompt, prompt_token_ids=seq.prompt_token_ids,
                           token_ids=list(seq.output_token_ids), finish_reason=seq.finish_reason,
                           metrics=seq.metrics)


def collect_step_records(self, step_tokens, finished):
    """Notebook 07: one `with self._lock:` around the whole loop; the streams of finished requests popped, of
    aborted ones (None) skipped. Delivery stays outside, in `_deliver`."""
    from roseinfer.server.manager import StepRecord

    done = set(finished)
    records = []
    with self._lock:
        for rid in step_tokens.keys() | done:
            stream = self._streams.pop(rid, None) if rid in done else self._streams.get(rid)
            if stream is not None:
                records.append(StepRecord(stream, step_tokens.get(rid), rid in done))
    return records


def graph_bucket(buckets, batch):
    """Notebook 09: the first (smallest) captured size that holds the batch, and the padding rows that fill it;
    None past the largest graph, where the step runs eagerly."""
    for bucket in buckets:
        if bucket >= batch:
            return bucket, bucket - batch
    return None


def paged_decode(q, k_cache, v_cache, block_table, context_len, scale):
    """Notebook 08: a block at a time through the table, each head keeping its running maximum, the running sum of
    exp(score - maximum) and the accumulated values; both rescaled by exp(old max - new max) whenever it grows."""
    import torch

    block_size = k_cache.shape[1]
    heads, dim = q.shape
    running_max = torch.full((heads,), float("-inf"))
    total, acc = torch.zeros(heads), torch.zeros(heads, dim)
    for start in range(0, context_len, block_size):
        block = int(block_table[start // block_size])
        n = min(block_size, context_len - start)  # the last block may be partly full
        k, v = k_cache[block, :n].float(), v_cache[block, :n].float()  # [n, H, D]
        scores = torch.einsum("hd,nhd->hn", q.float(), k) * scale  # head h against its own keys
        new_max = torch.maximum(running_max, scores.max(dim=1).values)
        rescale = torch.exp(running_max - new_max)  # 0 at the first block: exp(-inf)
        p = torch.exp(scores - new_max[:, None])
        total = total * rescale + p.sum(dim=1)
        acc = acc * rescale[:, None] + torch.einsum("hn,nhd->hd", p, v)
        running_max = new_max
    return acc / total[:, None]


def frame_stream(base, pieces, finish_reason):
    import json

    def event(data):  # one server-sent event: a `data:` line, then a blank line
        return "data: " + (data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)) + "\n\n"

    def chunk(text, reason):
        return {**base, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}

    return "".join(event(chunk(p, None)) for p in pieces) + event(chunk("", finish_reason)) + event("[DONE]")


def pack_batch(seqs):
    """Notebook 02: what ModelRunner.prepare builds. The sequences' new tokens go one after another, no padding, so
    one forward pass computes exactly the tokens there are; the offsets and lengths tell attention whose is which."""
    input_ids, positions, query_start_loc, context_lens, last_rows = [], [], [0], [], []
    for ids, start in seqs:
        input_ids += ids  # in the batch's order: the i-th sampled token goes back to the i-th sequence
        positions += range(start, start + len(ids))  # after the tokens already cached, not from 0
        query_start_loc.append(query_start_loc[-1] + len(ids))  # B + 1 offsets in all: where each sequence ends
        context_lens.append(start + len(ids))  # attends to its cache and its new tokens, itself included
        last_rows.append(query_start_loc[-1] - 1)  # its last token's logits predict the next token
    return input_ids, positions, query_start_loc, context_lens, last_rows


def schedule_step(running, waiting, max_batch_size):
    """Notebook 03: the finished leave first, then the free slots are counted, so a slot freed in the step just run
    is refilled now and not a step later; newcomers come from the front of the queue (first come, first served)."""
    finished = [rid for rid, tokens_left in running if tokens_left == 0]  # its last token is out: it leaves now
    free = max_batch_size - (len(running) - len(finished))  # any free slot, not only an empty batch
    return finished, list(waiting[:free])  # never more than the free slots: the batch stays within its limit


def prefix_blocks(token_ids, block_size, cached):
    """Notebook 10: admission's prefix-cache lookup, as BlockManager.match_prefix does it for OnlineScheduler._admit."""
    from roseinfer.engine.block_manager import chain_hash

    blocks, parent = [], None
    usable = len(token_ids) - 1  # the last prompt token is always computed: its logits give the first new token
    for start in range(0, usable - block_size + 1, block_size):  # full blocks only: a partial one is never cached
        key = chain_hash(parent, token_ids[start : start + block_size])  # covers every token before it, via parent
        if key not in cached:
            break  # the cached prefix ends here: this block and everything after it must be computed
        blocks.append(cached[key])
        parent = key
    return blocks


def pack_panels(weight):
    """Notebook 11: a weight [N, K] as roseinfer's bf16 kernel reads it, [ceil(N/32), K/2, 32, 2]."""
    n, k = weight.shape
    panels = -(-n // 32)  # 32 columns a panel: two zmm registers of 16 fp32 accumulators; a partial one counts
    padded = weight.new_zeros(panels * 32, k)  # same dtype; the columns past N zero, so the last panel is whole
    padded[:n] = weight
    # [panel, column, pair, 2] -> [panel, pair, column, 2]: one pair of k for all 32 columns is 64 values in a row,
    # the two loads of one step of the kernel's loop; the pair stays adjacent, as vdpbf16ps multiplies it
    return padded.view(panels, 32, k // 2, 2).permute(0, 2, 1, 3).contiguous()  # the kernel reads memory in order


def worker_pass(inbox, scheduler, outputs):
    """Notebook 04: one pass of SchedulerManager's worker loop: take the inbox, step once, route by request id."""
    import queue

    while True:  # every submission since the last pass: taking one a pass would let a burst pile up
        try:
            request_id, request, out = inbox.get_nowait()  # never wait here: requests may be running
        except queue.Empty:
            break
        scheduler.add_request(request, request_id=request_id)  # the handler's id, so step() speaks of it
        outputs[request_id] = out
    if not scheduler.has_unfinished():
        return  # nothing to step: the loop around waits for a submission
    for request_id, token in scheduler.step().items():  # one batch for every request in flight
        outputs[request_id].put(token)  # by id: a request mid-prefill gets no token, so positions shift
    for request_id in scheduler.pop_finished_ids():  # after the step: the ones it just ended, last token already put
        outputs.pop(request_id).put(None)  # popped, so a request is ended once and the dict does not grow


def worker_idle(self):
    """Notebook 05: SchedulerManager._idle. Callers queue work under self._lock and set the event after releasing it."""
    with self._lock:
        if self._pending or self._aborts or self._stopping:
            return  # work came after the worker last looked: back to the loop, which takes it
        # Cleared in the same critical section as the check: work queued before it is seen above, and the set() of
        # work queued after it comes after this clear, so it cannot be erased. Cleared outside the lock, a request
        # queued between the check and the clear would have its set() erased: a lost wake-up.
        self._wakeup.clear()  # also drops a set() left by work the worker took while busy: no wake-up for nothing
    self._wakeup.wait()  # no timeout: only a set() wakes it, at once, and an idle worker never wakes otherwise


def greedy_loop(engine, token_ids, n):
    ids, new = list(token_ids), []
    for _ in range(n):
        token = int(engine.prompt_logits(ids)[-1].argmax())  # the last position's logits give the next token
        new.append(token)
        ids.append(token)
    return new
