"""OnlineScheduler: the continuous-batching policy over the paged KV cache.

It decides, and only decides: the engine runs what it decides. Each step,

    batch = scheduler.schedule()              # who computes which tokens
    sampled = engine.runner.execute(batch.entries)
    finished = scheduler.update(batch, sampled)   # apply the tokens, finish requests

`schedule()` gives every running request its next tokens, oldest first (one
token for a decoding request, the next chunk for one still prefilling); when
the KV pool is out of blocks the most recently admitted request is preempted
(its blocks freed, its tokens recomputed later). Then it admits waiting
requests while the token budget, the batch size and the cap on new prompts
per step allow, reusing prefix-cache blocks where a prompt starts like an
earlier one; a prompt longer than the remaining budget is prefilled in chunks.
`update()` appends each sampled token and finishes requests on EOS or length.

Every request gets exactly the tokens it would get alone: its attention only
ever sees its own (or identical, shared) blocks, and its random stream is its
own. Requests arrive validated (`InferenceEngine.validate`): the scheduler
never tokenizes, and stop strings belong to whoever reads the text (the
request's `TextStream`), which ends a request early with `finish_request`.
The request state is private; callers use the public methods.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Any

from roseinfer.config import SchedulerLimits
from roseinfer.engine.batch import BatchEntry, ScheduledBatch
from roseinfer.engine.block_manager import BlockManager, blocks_for, chain_hash
from roseinfer.engine.sequence import (
    FinishedRequest,
    Request,
    RequestMetrics,
    RequestStatus,
    Sequence,
)
from roseinfer.errors import InvalidRequestError


class OnlineScheduler:
    def __init__(self, block_manager: BlockManager, limits: SchedulerLimits, eos_token_ids: frozenset[int]) -> None:
        self._blocks = block_manager
        self.limits = limits
        self.eos_token_ids = frozenset(eos_token_ids)  # end-of-text, and the model's end-of-turn ids
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in admission order
        self._requests: dict[int, Sequence] = {}
        self._finished_ids: list[int] = []
        self._ids = itertools.count()
        self._num_steps = 0
        self._num_generated_tokens = 0  # every sampled token, for a generation rate (a gateway's load report)
        self._last_step: dict[str, int] = {"batch_size": 0, "num_tokens": 0, "num_prompt_tokens": 0}
        self._num_preemptions = 0
        self._last_preempted = False  # the last schedule() preempted someone
        self._prefix_query_tokens = 0
        self._prefix_hit_tokens = 0

    @property
    def enable_prefix_cache(self) -> bool:
        return self.limits.enable_prefix_cache

    # -- submitting ------------------------------------------------------------------
    def add_request(self, request: Request, request_id: int | None = None) -> int:
        """Queue a validated request (prefill happens in a later step); returns its id."""
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self._requests:
                request_id = next(self._ids)
        elif request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id} is already in use", "request_id")
        seq = Sequence(
            request_id=request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            params=request.params,
            generator=request.generator,
            metrics=RequestMetrics(arrival_time=time.perf_counter()),
        )
        self._requests[request_id] = seq
        self._waiting.append(seq)
        return request_id

    # -- stepping --------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        """Choose this step's work (running requests first, then admissions); empty if none."""
        batch = ScheduledBatch()
        budget = self._schedule_running(batch, self.limits.max_num_batched_tokens)
        self._schedule_admissions(batch, budget)
        if batch:
            self._num_steps += 1
            self._record_step(batch)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        """Give running requests their next tokens, preempting the newest when the pool is short."""
        self._last_preempted = False
        i = 0
        while i < len(self._running) and budget > 0:
            seq = self._running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self._reserve(seq, seq.num_computed_tokens + n):
                victim = self._running[-1]  # the most recently admitted
                self._preempt(victim)
                self._last_preempted = True
                if victim is seq:
                    return budget
            self._add_to_batch(batch, seq, n)
            budget -= n
            i += 1
        return budget

    def _schedule_admissions(self, batch: ScheduledBatch, budget: int) -> None:
        if self._last_preempted:
            return  # admitting while the pool is short would only preempt again next step
        admitted = 0
        while (
            self._waiting
            and budget > 0
            and len(self._running) < self.limits.max_batch_size
            and admitted < self.limits.max_prefills_per_step
        ):
            n = self._admit(self._waiting[0], budget)
            if n == 0:
                break
            seq = self._waiting.popleft()
            self._running.append(seq)
            self._add_to_batch(batch, seq, n)
            budget -= n
            admitted += 1

    def _add_to_batch(self, batch: ScheduledBatch, seq: Sequence, n: int) -> None:
        start = seq.num_computed_tokens
        end = start + n
        batch.scheduled.append((seq, n))
        batch.entries.append(
            BatchEntry(seq.tokens(start, end), start, seq.block_table, end == seq.num_tokens, seq.params, seq.generator)
        )

    def _record_step(self, batch: ScheduledBatch) -> None:
        now = time.perf_counter()
        num_tokens = num_prompt_tokens = 0
        for seq, n in batch.scheduled:
            start = seq.num_computed_tokens
            num_tokens += n
            if start < seq.num_prompt_tokens:
                num_prompt_tokens += min(start + n, seq.num_prompt_tokens) - start
            seq.metrics.num_steps += 1
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
        self._last_step = {
            "batch_size": len(batch),
            "num_tokens": num_tokens,
            "num_prompt_tokens": num_prompt_tokens,
        }

    def update(self, batch: ScheduledBatch, sampled: list[int | None]) -> list[int]:
        """Apply one step's sampled tokens (one per entry, None where it did not sample).

        Returns the ids of the requests that finished in this step (EOS or length).
        """
        now = time.perf_counter()
        finished = []
        block_size = self._blocks.block_size
        for (seq, n), token in zip(batch.scheduled, sampled):
            if seq.status is not RequestStatus.RUNNING:
                continue  # finished or discarded between schedule() and update()
            seq.num_computed_tokens += n
            # Only when a block has just filled up is there anything to register.
            if self.enable_prefix_cache and seq.num_computed_tokens // block_size > len(seq.block_hashes):
                self._register_full_blocks(seq)
            if token is None:
                continue
            seq.output_token_ids.append(token)
            self._num_generated_tokens += 1
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self._finish(seq, reason, now)
                finished.append(seq.request_id)
        return finished

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Make the sequence's blocks cover num_tokens; False if the pool is short."""
        needed = blocks_for(num_tokens, self._blocks.block_size) - len(seq.block_table)
        if needed <= 0:
            return True
        if not self._blocks.can_allocate(needed):
            return False
        seq.block_table += self._blocks.allocate(needed)
        return True

    def _admit(self, seq: Sequence, budget: int) -> int:
        """Give a waiting request its blocks; returns the tokens it computes now (0: not now)."""
        size = self._blocks.block_size
        hits: list[int] = []
        hashes: list[int] = []
        if self.enable_prefix_cache:
            # Leave the last token uncached: its logits are what we need.
            hits, hashes = self._blocks.match_prefix(seq.tokens(0, seq.num_tokens), seq.num_tokens - 1)
        cached = len(hits) * size
        n = min(seq.num_tokens - cached, budget)
        needed = blocks_for(cached + n, size) - len(hits)
        if not self._blocks.can_allocate(needed, reusing=hits):
            return 0
        self._blocks.share(hits)
        seq.block_table = hits + self._blocks.allocate(needed)
        seq.block_hashes = hashes
        seq.num_computed_tokens = cached
        seq.status = RequestStatus.RUNNING
        if seq.metrics.num_preemptions == 0:
            seq.metrics.num_cached_tokens = cached
            if self.enable_prefix_cache:
                self._prefix_query_tokens += seq.num_tokens
                self._prefix_hit_tokens += cached
        return n

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        self._running.remove(seq)
        seq.status = RequestStatus.WAITING
        seq.num_computed_tokens = 0
        seq.metrics.num_preemptions += 1
        self._num_preemptions += 1
        self._waiting.appendleft(seq)

    def _release(self, seq: Sequence) -> None:
        self._blocks.free(seq.block_table)
        seq.block_table = []
        seq.block_hashes = []

    def _register_full_blocks(self, seq: Sequence) -> None:
        size = self._blocks.block_size
        for j in range(len(seq.block_hashes), seq.num_computed_tokens // size):
            tokens = seq.tokens(j * size, (j + 1) * size)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            h = chain_hash(parent, tokens)
            self._blocks.register(seq.block_table[j], h, tokens)
            seq.block_hashes.append(h)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        if seq.params.is_eos_stop(token, self.eos_token_ids):
            return "stop"
        if len(seq.output_token_ids) >= seq.params.max_new_tokens:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        self._release(seq)
        self._running.remove(seq)
        self._mark_finished(seq, reason, now)

    def _mark_finished(self, seq: Sequence, reason: str, now: float) -> None:
        seq.status = RequestStatus.FINISHED
        seq.finish_reason = reason
        seq.metrics.finish_time = now
        self._finished_ids.append(seq.request_id)

    # -- public accessors --------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def num_unfinished(self) -> int:
        return len(self._waiting) + len(self._running)

    def num_waiting(self) -> int:
        return len(self._waiting)

    def num_running(self) -> int:
        return len(self._running)

    def num_waiting_tokens(self) -> int:
        """Tokens the waiting requests still have to prefill (before any prefix-cache hit: an upper bound)."""
        return sum(seq.num_tokens - seq.num_computed_tokens for seq in self._waiting)

    def _get(self, request_id: int) -> Sequence:
        try:
            return self._requests[request_id]
        except KeyError:
            raise KeyError(f"unknown request id {request_id}") from None

    def is_finished(self, request_id: int) -> bool:
        return self._get(request_id).is_finished

    def get_generated_ids(self, request_id: int) -> list[int]:
        """A copy: the caller may keep or change it without touching the scheduler."""
        return list(self._get(request_id).output_token_ids)

    def get_step_count(self, request_id: int) -> int:
        """Scheduler steps this request took part in (prefill chunks and decodes)."""
        return self._get(request_id).metrics.num_steps

    def get_finish_reason(self, request_id: int) -> str | None:
        return self._get(request_id).finish_reason

    def pop_finished_ids(self) -> list[int]:
        """Ids of the requests finished since the last call."""
        ids, self._finished_ids = self._finished_ids, []
        return ids

    def pop_response(self, request_id: int) -> FinishedRequest:
        """The finished request's tokens and outcome; the scheduler forgets it."""
        seq = self._get(request_id)
        if not seq.is_finished:
            raise ValueError(f"request {request_id} is not finished")
        del self._requests[request_id]
        return FinishedRequest(
            request_id=request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            token_ids=list(seq.output_token_ids),
            finish_reason=seq.finish_reason,
            metrics=seq.metrics,
        )

    def finish_request(self, request_id: int, reason: str = "stop") -> None:
        """End a running or waiting request now (its reader saw a stop string); blocks are freed.

        Its tokens so far stay readable until `pop_response`, like any finished request's.
        """
        seq = self._get(request_id)
        if seq.is_finished:
            return
        if seq.status is RequestStatus.WAITING:
            self._waiting.remove(seq)
        else:
            self._release(seq)
            self._running.remove(seq)
        self._mark_finished(seq, reason, time.perf_counter())

    def discard_request(self, request_id: int) -> bool:
        """Forget a request wherever it is; a running one is aborted and its blocks freed."""
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return False
        if seq.status is RequestStatus.RUNNING:
            self._release(seq)
            self._running.remove(seq)
        elif seq.status is RequestStatus.WAITING:
            self._waiting.remove(seq)
        if request_id in self._finished_ids:
            self._finished_ids.remove(request_id)
        return True

    def last_step_stats(self) -> dict[str, int]:
        """The shape of the last step: requests in it, tokens computed, of which prompt tokens."""
        return dict(self._last_step)

    def kv_stats(self) -> dict[str, Any]:
        queries, hits = self._prefix_query_tokens, self._prefix_hit_tokens
        return {
            "used_blocks": self._blocks.num_used_blocks,
            "free_blocks": self._blocks.num_free_blocks,
            "total_blocks": self._blocks.num_blocks,
            "cached_blocks": self._blocks.num_cached_blocks,
            "block_size": self._blocks.block_size,
            "prefix_cache_queries": queries,  # prompt tokens looked up
            "prefix_cache_hits": hits,  # of which found in the cache
            "prefix_cache_hit_rate": hits / queries if queries else 0.0,
            "num_preemptions": self._num_preemptions,
            "num_steps": self._num_steps,
            "num_generated_tokens": self._num_generated_tokens,
        }
