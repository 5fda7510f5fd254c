"""Benchmark workloads: lists of requests, reproducible from a seed.

Prompts are token ids drawn from the GPT-2 vocabulary, or from a smaller
one's ordinary tokens (`vocab`), so their length is exact, except `fixed_prompt`, which tokenizes a given text. Output lengths
are exact too: benchmarks run with EOS ignored unless they say otherwise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Token ids below this are ordinary BPE tokens (50256 is <|endoftext|>).
VOCAB_FOR_PROMPTS = 50000


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    max_new_tokens: int
    prompt: str | None = None  # the text, when the workload has one


def _random_ids(rng: random.Random, n: int, vocab: int = VOCAB_FOR_PROMPTS) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def fixed_prompt(tokenizer, text: str, num_requests: int, max_new_tokens: int) -> list[BenchRequest]:
    """The same prompt every time (the streaming reference workload uses "Hello")."""
    ids = tokenizer.encode(text)
    return [BenchRequest(list(ids), max_new_tokens, text) for _ in range(num_requests)]


def random_prompts(
    num_requests: int, input_len: int | tuple[int, int], output_len: int | tuple[int, int], seed: int = 0,
    vocab: int = VOCAB_FOR_PROMPTS,
) -> list[BenchRequest]:
    """Random token prompts (ids below `vocab`); a length is a fixed int or an inclusive (low, high) range."""
    rng = random.Random(seed)

    def draw(spec: int | tuple[int, int]) -> int:
        return spec if isinstance(spec, int) else rng.randint(*spec)

    return [
        BenchRequest(_random_ids(rng, draw(input_len), vocab), draw(output_len)) for _ in range(num_requests)
    ]


def mixed_output_lengths(
    num_requests: int,
    input_len: int | tuple[int, int] = (16, 64),
    output_len: tuple[int, int] = (8, 128),
    seed: int = 0,
    vocab: int = VOCAB_FOR_PROMPTS,
) -> list[BenchRequest]:
    """Output lengths spread over a range: where static batching pads and continuous batching does not."""
    return random_prompts(num_requests, input_len, output_len, seed, vocab)


def shared_prefix_prompts(
    num_requests: int, prefix_len: int, suffix_len: int, output_len: int, num_prefixes: int = 1, seed: int = 0
) -> list[BenchRequest]:
    """Prompts that start with one of a few shared "system prompts": what a prefix cache saves."""
    rng = random.Random(seed)
    prefixes = [_random_ids(rng, prefix_len) for _ in range(num_prefixes)]
    return [
        BenchRequest(prefixes[i % num_prefixes] + _random_ids(rng, suffix_len), output_len)
        for i in range(num_requests)
    ]


def poisson_arrivals(num_requests: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Arrival offsets in seconds: gamma-distributed gaps with mean 1/rate (burstiness 1 = Poisson).

    `rate` = inf sends everything at t = 0.
    """
    if rate == float("inf"):
        return [0.0] * num_requests
    rng = random.Random(seed)
    shape = burstiness
    scale = 1.0 / (rate * shape)
    t, out = 0.0, []
    for _ in range(num_requests):
        out.append(t)
        t += rng.gammavariate(shape, scale)
    return out
