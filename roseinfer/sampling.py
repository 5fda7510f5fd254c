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
    """Every sampling field, in one place: the engine, the server and the benchmarks take this."""

    max_new_tokens: int | None = 16  # None: as many as the model's context leaves (InferenceEngine.validate)
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
        if self.max_new_tokens is not None and (not _is_int(self.max_new_tokens) or self.max_new_tokens < 1):
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

    def is_eos_stop(self, token_id: int, eos_token_ids: frozenset[int]) -> bool:
        """Whether this token ends the request as EOS (the model's end-of-text or end-of-turn ids):
        counted as generated, never shown as text."""
        return self.stop_on_eos and token_id in eos_token_ids

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


SAMPLING_CHUNK = 1024  # tokens per chunk of the two-level lookup in inverse_cdf_sample


def inverse_cdf_sample(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `probs` [rows, vocab] (not necessarily normalized), drawn from that row.

    One uniform number u per row picks the token whose share of the row's
    running sum covers u times the row's total. A row with a generator (a
    seeded request) draws its u from it, so its tokens do not depend on the
    rest of the batch.

    Why not an exponential race (argmax of p / E, one E ~ Exp(1) per token)?
    It draws a random number for each of GPT-2's 50,257 tokens, every row,
    every step: 12 ms a step for 16 rows on a 2-core CPU, a third of the
    forward pass. This draws one number a row.

    The lookup has two levels, so every running sum is short and kept in
    float64: first the chunk of SAMPLING_CHUNK tokens (a running sum over
    ~50 chunk totals), then the token inside that chunk (a running sum over
    its 1,024 probabilities). One float32 running sum over the whole
    vocabulary would be as fast, but there a token below half a float32 step
    of the sum so far (3e-8 near the end) would add nothing and never be drawn.
    """
    rows, vocab = probs.shape
    device = probs.device
    uniform = torch.rand(rows, 1, device=device, dtype=torch.float64)
    for row, generator in enumerate(generators):
        if generator is not None:
            uniform[row] = torch.rand(1, generator=generator, device=device, dtype=torch.float64)
    # Level 1: which chunk. The last chunk may be shorter than the others.
    full = vocab - vocab % SAMPLING_CHUNK
    chunk_totals = probs[:, :full].reshape(rows, -1, SAMPLING_CHUNK).sum(-1).to(torch.float64)
    if full < vocab:
        tail = probs[:, full:].sum(-1, keepdim=True).to(torch.float64)
        chunk_totals = torch.cat([chunk_totals, tail], dim=1)
    chunk_cdf = chunk_totals.cumsum(dim=-1)
    target = uniform * chunk_cdf[:, -1:]
    chunk = first_index_above(chunk_cdf, target)
    # Level 2: which token of that chunk, with what is left of the target once the chunks before it are passed.
    remainder = target - (chunk_cdf - chunk_totals).gather(1, chunk)
    ids = chunk * SAMPLING_CHUNK + torch.arange(SAMPLING_CHUNK, device=device)
    in_chunk = probs.gather(1, ids.clamp(max=vocab - 1)).to(torch.float64).masked_fill(ids >= vocab, 0.0)
    return (chunk * SAMPLING_CHUNK + first_index_above(in_chunk.cumsum(dim=-1), remainder)).squeeze(1)


def first_index_above(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose running sum exceeds the target: an index of nonzero probability.

    Rounding can put the target at or past the row's total; then the index is
    the last one with any probability (the first that reaches the total).
    """
    picked = torch.searchsorted(cdf, target, right=True)
    return torch.minimum(picked, torch.searchsorted(cdf, cdf[:, -1:].contiguous()))


def greedy_pick(logits: torch.Tensor) -> torch.Tensor:
    """Each row's most likely token. CPU bf16 logits go to the C kernel that reads them as they are
    (0.05 ms for 32 x 50,257 against 0.5 ms to widen them to fp32 and call argmax)."""
    from roseinfer.kernels.cpu.bindings import argmax_bf16  # the CPU kernels' library, built once

    picked = argmax_bf16(logits)
    return picked if picked is not None else logits.float().argmax(dim=-1)


class Sampler:
    """Picks the next token of every row; greedy rows take the argmax."""

    def __call__(
        self,
        logits: torch.Tensor,  # [rows, vocab]; overwritten when every row samples
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> torch.Tensor:
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if not sampled_rows:
            return greedy_pick(logits)
        logits = logits.float()  # sample in fp32 whatever the model's dtype
        device = logits.device
        everyone = len(sampled_rows) == len(params)
        rows = None if everyone else torch.tensor(sampled_rows, device=device)
        # In place from here on, on `logits` itself when every row samples (the caller's fresh
        # tensor), else on a copy of the sampled rows: a new [rows, vocab] tensor at each of the
        # three steps below would cost more in page faults than the arithmetic (1.5 ms at 16 rows).
        sub = logits if everyone else logits[rows]
        sub.div_(torch.tensor([params[i].temperature for i in sampled_rows], device=device).unsqueeze(1))
        if any(params[i].top_k > 0 or params[i].top_p < 1.0 for i in sampled_rows):
            top_k = torch.tensor([params[i].top_k for i in sampled_rows], device=device)
            top_p = torch.tensor([params[i].top_p for i in sampled_rows], device=device)
            sub = apply_top_k_top_p(sub, top_k, top_p)
        # exp(logit - max): the softmax's numerator. inverse_cdf_sample needs no normalized rows.
        weights = sub.sub_(sub.amax(dim=-1, keepdim=True)).exp_()
        sampled = inverse_cdf_sample(weights, [generators[i] for i in sampled_rows])
        if everyone:
            return sampled
        greedy_tokens = logits.argmax(dim=-1)
        return greedy_tokens.index_put((rows,), sampled)
