"""Sampling parameters and the batched sampler.

One call samples the next token for every row of a batch, each row with its
own temperature, top-k, top-p and random stream. A request with a seed owns a
`torch.Generator`, so its tokens depend only on its seed and its logits, never
on which other requests share the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from roseinfer.errors import InvalidRequestError

# The bounds every request is held to, whichever route or API it comes from.
# They are checked in the caller's thread, so nothing a request carries can
# raise inside the engine's worker or slow the requests batched with it.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes (negatives wrap mod 2^64)
GREEDY_EPSILON = 1e-5  # a temperature below this is greedy (as in vLLM): 1/T would overflow fp32 logits
MAX_STOP_STRINGS = 4  # OpenAI's limit; stop matching runs on the worker for every generated token
MAX_STOP_CHARS = 256  # total characters over all stop strings


@dataclass
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1 = no nucleus cut
    seed: int | None = None
    stop_on_eos: bool = True
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise InvalidRequestError(
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}", "max_tokens"
            )
        self.temperature = _finite_float(self.temperature, "temperature")
        if self.temperature < 0.0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature!r}", "temperature")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InvalidRequestError(
                f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}", "top_k"
            )
        self.top_p = _finite_float(self.top_p, "top_p")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX):
            raise InvalidRequestError(
                f"seed must be an integer in [-2**63, 2**64 - 1], got {self.seed!r}", "seed"
            )
        self._check_stop()

    def _check_stop(self) -> None:
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty strings", "stop")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}", "stop"
            )
        total = sum(len(s) for s in self.stop)
        if total > MAX_STOP_CHARS:
            raise InvalidRequestError(
                f"the stop strings have {total} characters in all; at most {MAX_STOP_CHARS} are allowed",
                "stop",
            )

    def check_for_model(self, vocab_size: int) -> None:
        """The bounds that depend on the model: top_k cannot exceed the vocabulary."""
        if self.top_k > vocab_size:
            raise InvalidRequestError(
                f"top_k must be at most the vocabulary size ({vocab_size}), got {self.top_k}", "top_k"
            )

    def is_eos_stop(self, token_id: int, eos_token_id: int) -> bool:
        """Whether this token ends the request as EOS: counted as generated, never shown as text."""
        return self.stop_on_eos and token_id == eos_token_id

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON

    def make_generator(self, device: torch.device) -> torch.Generator | None:
        """A private random stream for a seeded sampled request, else None (global RNG)."""
        if self.greedy or self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python


def _finite_float(value: object, name: str) -> float:
    """`value` as a finite float, or InvalidRequestError naming the field (NaN, ±inf, 1e400, "hot")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            as_float = float(value)
        except OverflowError:
            as_float = math.inf
        if math.isfinite(as_float):
            return as_float
    raise InvalidRequestError(f"{name} must be a finite number, got {value!r}", name)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask with -inf every logit outside each row's top-k and nucleus (top-p).

    `top_k[i] == 0` and `top_p[i] == 1` leave row i untouched. The most likely
    token always survives.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab).unsqueeze(1)
    drop = ranks >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # Drop a token once the tokens ranked above it already hold top_p of the mass.
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p.unsqueeze(1)
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampler:
    """Picks the next token of every row; greedy rows take the argmax."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> torch.Tensor:
        logits = logits.float()  # sample in fp32 whatever the model's dtype
        greedy_tokens = logits.argmax(dim=-1)
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled_rows:
            return greedy_tokens
        device = logits.device
        rows = torch.tensor(sampled_rows, device=device)
        sub = logits[rows] / torch.tensor(
            [params[i].temperature for i in sampled_rows], device=device
        ).unsqueeze(1)
        if any(params[i].top_k > 0 or params[i].top_p < 1.0 for i in sampled_rows):
            top_k = torch.tensor([params[i].top_k for i in sampled_rows], device=device)
            top_p = torch.tensor([params[i].top_p for i in sampled_rows], device=device)
            sub = apply_top_k_top_p(sub, top_k, top_p)
        probs = sub.softmax(dim=-1)
        # Exponential-race sampling: argmax(p / E) with E ~ Exp(1) draws from p,
        # and lets each seeded row use its own generator for its own noise.
        noise = torch.empty_like(probs).exponential_()
        for j, i in enumerate(sampled_rows):
            if generators[i] is not None:
                noise[j].exponential_(generator=generators[i])
        noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # a zero draw would make 0/0 = NaN
        sampled = (probs / noise).argmax(dim=-1)
        return greedy_tokens.index_put((rows,), sampled)
