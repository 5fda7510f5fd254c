"""OnlineScheduler: continuous batching over the paged KV cache.

Requests join and leave the running batch at any step. Each `step()`:

1. gives every running request its next tokens, oldest first: one token for a
   decoding request, the next chunk for one still prefilling its prompt;
   if the KV pool is out of blocks, the most recently admitted request is
   preempted (its blocks freed, its tokens recomputed later);
2. admits waiting requests while the token budget, the batch size and the
   cap on new prompts per step (`prefill_max_batch_size`) allow, reusing prefix-cache blocks where their prompt starts like an earlier one;
   a prompt longer than the remaining budget is prefilled in chunks over
   several steps;
3. runs all of it as one forward pass and samples a token for each request
   whose prompt is fully computed, then finishes those that hit EOS, a stop
   string or their length.

Every request gets exactly the tokens it would get alone: its attention only
ever sees its own (or identical, shared) blocks, and its random stream is its
own. The request state is private; callers use the public methods.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from roseinfer.detokenizer import TextStream, first_stop
from roseinfer.engine.block_manager import blocks_for, chain_hash
from roseinfer.engine.runner import BatchEntry
from roseinfer.engine.sequence import (
    GenerationOutput,
    RequestMetrics,
    RequestStatus,
    Sequence,
)
from roseinfer.errors import InvalidRequestError
from roseinfer.sampling import SamplingParams

logger = logging.getLogger("roseinfer.engine")

if TYPE_CHECKING:
    from roseinfer.engine.engine import InferenceEngine


class OnlineScheduler:
    def __init__(
        self,
        engine: InferenceEngine,
        max_batch_size: int | None = None,
        max_num_batched_tokens: int | None = None,
        enable_prefix_cache: bool | None = None,
        prefill_max_batch_size: int | None = None,
    ) -> None:
        cfg = engine.config
        self._engine = engine
        self._runner = engine.runner
        self._blocks = engine.block_manager
        self._tokenizer = engine.tokenizer
        self.max_batch_size = max_batch_size or cfg.max_batch_size
        self.max_num_batched_tokens = max_num_batched_tokens or cfg.max_num_batched_tokens
        # A burst of new prompts all prefilling in one step stalls every running decode for
        # that step; capping admissions spreads the burst over several steps.
        self.prefill_max_batch_size = (
            prefill_max_batch_size or cfg.prefill_max_batch_size or self.max_batch_size
        )
        self.enable_prefix_cache = (
            cfg.enable_prefix_cache if enable_prefix_cache is None else enable_prefix_cache
        )
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in admission order
        self._requests: dict[int, Sequence] = {}
        self._finished_ids: list[int] = []
        self._ids = itertools.count()
        self._num_steps = 0
        self._last_step: dict[str, int] = {"batch_size": 0, "num_tokens": 0, "num_prompt_tokens": 0}
        self._num_preemptions = 0
        self._prefix_query_tokens = 0
        self._prefix_hit_tokens = 0

    # -- submitting ------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | None = None,
        prompt_token_ids: list[int] | None = None,
        max_new_tokens: int = 16,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_on_eos: bool = True,
        seed: int | None = None,
        request_id: int | None = None,
        stop: list[str] | None = None,
        params: SamplingParams | None = None,
    ) -> int:
        """Queue a request (prefill happens in `step()`); returns its id."""
        if params is None:
            params = SamplingParams(
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                seed=seed,
                stop_on_eos=stop_on_eos,
                stop=list(stop or []),
            )
        token_ids = self.validate_request(prompt, prompt_token_ids, params)
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self._requests:
                request_id = next(self._ids)
        elif request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id} is already in use", "request_id")
        seq = Sequence(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=token_ids,
            params=params,
            generator=params.make_generator(self._runner.device),
            metrics=RequestMetrics(arrival_time=time.perf_counter()),
            stop_stream=TextStream(self._tokenizer, params.stop) if params.stop else None,
        )
        self._requests[request_id] = seq
        self._waiting.append(seq)
        return request_id

    def validate_request(
        self, prompt: str | None, prompt_token_ids: list[int] | None, params: SamplingParams
    ) -> list[int]:
        """The prompt's token ids, or InvalidRequestError if the request could never run.

        Reads only configuration, so another thread may call it (the server
        validates and tokenizes before it queues anything).
        """
        params.check_for_model(self._engine.model_config.vocab_size)
        token_ids = self._prompt_tokens(prompt, prompt_token_ids)
        self._check_fits(len(token_ids), params.max_new_tokens)
        return token_ids

    def _prompt_tokens(self, prompt: str | None, prompt_token_ids: list[int] | None) -> list[int]:
        if (prompt is None) == (prompt_token_ids is None):
            raise InvalidRequestError("give exactly one of prompt and prompt_token_ids", "prompt")
        if prompt is not None:
            token_ids = self._tokenizer.encode(prompt)
        else:
            token_ids = list(prompt_token_ids)
            vocab = self._engine.model_config.vocab_size
            bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(
                    f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}", "prompt"
                )
        if not token_ids:
            raise InvalidRequestError("the prompt is empty; GPT-2 needs at least one token", "prompt")
        return token_ids

    def _check_fits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        limit = self._engine.max_model_len
        if num_prompt_tokens + max_new_tokens > limit:
            raise InvalidRequestError(
                f"the prompt has {num_prompt_tokens} tokens and {max_new_tokens} new tokens were "
                f"asked for: {num_prompt_tokens + max_new_tokens} is more than the model's context "
                f"of {limit} tokens",
                "max_tokens",
            )
        # The last sampled token is never fed back, so its K/V needs no slot.
        needed = blocks_for(num_prompt_tokens + max_new_tokens - 1, self._blocks.block_size)
        if needed > self._blocks.num_blocks:
            raise InvalidRequestError(
                f"the request needs {needed} KV blocks but the whole pool has "
                f"{self._blocks.num_blocks}; it could never run",
                "max_tokens",
            )

    # -- stepping --------------------------------------------------------------------
    def step(self) -> dict[int, int]:
        """Run one batch; returns {request_id: token} for every token produced."""
        scheduled = self._schedule()
        if not scheduled:
            return {}
        self._num_steps += 1
        now = time.perf_counter()
        entries = []
        num_tokens = num_prompt_tokens = 0
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            end = start + n
            num_tokens += n
            if start < seq.num_prompt_tokens:
                num_prompt_tokens += min(end, seq.num_prompt_tokens) - start
            entries.append(
                BatchEntry(
                    seq.tokens(start, end),
                    start,
                    seq.block_table,
                    end == seq.num_tokens,
                    seq.params,
                    seq.generator,
                )
            )
            metrics = seq.metrics
            metrics.num_steps += 1
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
        self._last_step = {
            "batch_size": len(scheduled),
            "num_tokens": num_tokens,
            "num_prompt_tokens": num_prompt_tokens,
        }
        sampled = self._runner.execute(entries)
        now = time.perf_counter()
        produced: dict[int, int] = {}
        block_size = self._blocks.block_size
        for (seq, n), token in zip(scheduled, sampled):
            seq.num_computed_tokens += n
            # Only when a block has just filled up is there anything to register.
            if self.enable_prefix_cache and seq.num_computed_tokens // block_size > len(seq.block_hashes):
                self._register_full_blocks(seq)
            if token is None:
                continue
            seq.output_token_ids.append(token)
            produced[seq.request_id] = token
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            try:
                reason = self._finish_reason(seq, token)
            except Exception as exc:  # this request's own stop strings or text: it fails alone
                logger.exception("request %s failed; the others go on", seq.request_id)
                seq.error, reason = repr(exc), "error"
            if reason is not None:
                self._finish(seq, reason, now)
        return produced

    def _schedule(self) -> list[tuple[Sequence, int]]:
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Sequence, int]] = []
        preempted = False
        i = 0
        while i < len(self._running) and budget > 0:
            seq = self._running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self._reserve(seq, seq.num_computed_tokens + n):
                victim = self._running[-1]  # the most recently admitted
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append((seq, n))
                budget -= n
                i += 1
                continue
            break
        # Admitting while the pool is short would only preempt again next step.
        admitted = 0
        while (
            self._waiting
            and budget > 0
            and not preempted
            and len(self._running) < self.max_batch_size
            and admitted < self.prefill_max_batch_size
        ):
            n = self._admit(self._waiting[0], budget)
            if n == 0:
                break
            seq = self._waiting.popleft()
            self._running.append(seq)
            scheduled.append((seq, n))
            budget -= n
            admitted += 1
        return scheduled

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

    def _is_eos_stop(self, seq: Sequence, token: int) -> bool:
        return seq.params.is_eos_stop(token, self._engine.eos_token_id)

    def _text_token_ids(self, seq: Sequence) -> list[int]:
        """The tokens that make the text: an EOS that ended the request is counted, not shown."""
        ids = seq.output_token_ids
        return ids[:-1] if ids and self._is_eos_stop(seq, ids[-1]) else ids

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        if self._is_eos_stop(seq, token):
            return "stop"
        if seq.stop_stream is not None:
            seq.stop_stream.push(token)
            if seq.stop_stream.stopped:
                return "stop"
        if len(seq.output_token_ids) >= seq.params.max_new_tokens:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        self._release(seq)
        self._running.remove(seq)
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

    def get_error(self, request_id: int) -> str | None:
        """Why the request failed (its finish reason is then "error"), else None."""
        return self._get(request_id).error

    def pop_finished_ids(self) -> list[int]:
        """Ids of the requests finished since the last call."""
        ids, self._finished_ids = self._finished_ids, []
        return ids

    def pop_response(self, request_id: int) -> GenerationOutput:
        """The finished request's output; the scheduler forgets it."""
        seq = self._get(request_id)
        if not seq.is_finished:
            raise ValueError(f"request {request_id} is not finished")
        del self._requests[request_id]
        text = self._tokenizer.decode(self._text_token_ids(seq))
        if seq.stop_stream is not None and seq.stop_stream.stopped:
            text = text[: first_stop(text, seq.params.stop)]
        return GenerationOutput(
            request_id=request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            text=text,
            token_ids=list(seq.output_token_ids),
            finish_reason=seq.finish_reason,
            metrics=seq.metrics,
            error=seq.error,
        )

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
        }
