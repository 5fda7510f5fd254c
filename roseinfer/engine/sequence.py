"""Per-request state inside the scheduler, and what a finished request returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from roseinfer.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds KV blocks; prefilling (maybe in chunks) or decoding
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    num_steps: int = 0  # scheduler steps this request took part in
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache (first admission)


@dataclass
class Request:
    """A request that passed `InferenceEngine.validate`: what the scheduler queues."""

    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None  # its own random stream (seeded sampling)
    prompt: str | None = None  # the text it came from, if any


@dataclass
class FinishedRequest:
    """What the scheduler hands back for a finished request: tokens and outcome, no text."""

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    metrics: RequestMetrics


@dataclass
class GenerationOutput(FinishedRequest):
    """A finished request with its text (`InferenceEngine.generate`'s result)."""

    text: str = ""


@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    metrics: RequestMetrics
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in this sequence's blocks
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of its full blocks
    finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without building the whole list."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
