"""The same-answer check of the manager notebooks (04-07): every stream gets its own prompt's tokens.

A manager variant changes how a step's tokens reach their streams, so the check
that matters is that each request gets exactly the greedy tokens, text and
finish reason the engine gives its prompt without any manager. One prompt for
all would hide a token handed to the wrong stream; here every request has its
own prompt and its own length, and its token ids are recorded where every
variant hands them over (`RequestStream.on_token`).

`transformers_greedy` is the oracle of the model notebooks (14) and tests: Hugging Face recomputing the
whole sequence at every step, the simplest greedy decoding there is.

Between engines that compute in other precisions (notebook 11, benchmarks/compare_engines.py)
greedy tokens may differ: `agreement` says for how many requests, `matching_prefix` how soon.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

from roseinfer.engine.engine import InferenceEngine
from roseinfer.history import make_manager
from roseinfer.sampling import SamplingParams
from roseinfer.server.streams import RequestStream

VOCAB = 50000  # prompt ids are drawn below this: every GPT-2 model has at least that many tokens


def transformers_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens of a transformers model by full recomputation (no KV cache to get wrong)."""
    import torch

    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


@contextlib.contextmanager
def recorded_token_ids() -> Iterator[dict[RequestStream, list[int]]]:
    """The token ids each stream is handed while the block runs, by stream."""
    record: dict[RequestStream, list[int]] = {}
    original = RequestStream.on_token

    def on_token(stream: RequestStream, token_id: int, now: float) -> None:
        record.setdefault(stream, []).append(token_id)
        original(stream, token_id, now)

    RequestStream.on_token = on_token
    try:
        yield record
    finally:
        RequestStream.on_token = original


def distinct_requests(
    num_requests: int, new_tokens: int, seed: int = 0
) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts (token ids) and greedy parameters, each request with its own prompt and its own number of tokens.

    Random token ids rather than text: with random weights (the tiny model, or any offline
    machine), prompts that end alike make every request generate the same tokens, and a token
    handed to the wrong stream would go unseen; random prompts start each request elsewhere.
    """
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(4, 13))] for _ in range(num_requests)]
    params = [SamplingParams(max_new_tokens=new_tokens + i, stop_on_eos=False) for i in range(num_requests)]
    return prompts, params


def check_streams(
    engine: InferenceEngine, variants: dict[str, str], num_requests: int = 16, new_tokens: int = 8, **options
) -> str:
    """Serve the same distinct requests through each manager variant (name -> label), all in flight at once.

    Asserts that every stream got the engine's own greedy token ids, text and
    finish reason for its prompt; returns the sentence a notebook prints.
    """
    prompts, params = distinct_requests(num_requests, new_tokens)
    reference = engine.generate(prompts, params)
    texts = [out.text for out in reference]
    assert len(set(texts)) == num_requests, (
        "every request should have its own text, or a mix-up could not show"
    )
    # How many requests' first tokens differ from every other's: a token handed to the wrong stream shows at once.
    firsts = [out.token_ids[0] for out in reference]
    own_first = sum(firsts.count(token) == 1 for token in firsts)
    assert 2 * own_first >= num_requests, "most requests should start with a token of their own"
    for variant, label in variants.items():
        manager = make_manager(variant, engine, max_batch_size=num_requests, **options)
        try:
            with recorded_token_ids() as handed:
                streams = [manager.submit(prompt_token_ids=p, params=q) for p, q in zip(prompts, params)]
                streamed = ["".join(s.pieces(timeout=600)) for s in streams]
        finally:
            manager.close()
        for i, (stream, out) in enumerate(zip(streams, reference)):
            assert handed.get(stream) == out.token_ids, f"{label}: request {i} was handed other token ids"
            assert streamed[i] == out.text, (
                f"{label}: request {i}'s stream is not its own prompt's greedy text"
            )
            assert stream.end.finish_reason == out.finish_reason, f"{label}: request {i} finished differently"
    return (
        f"{num_requests} requests in flight through each variant: every stream got its own prompt's greedy ids, text "
        "and finish reason."
    )


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """Fraction of requests whose greedy tokens are identical to the reference engine's."""
    return sum(a == b for a, b in zip(tokens, reference)) / len(reference)


def matching_prefix(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """Mean share of each request's tokens that come before its first difference from the reference.

    Greedy decoding amplifies rounding: once one argmax flips (bf16, int8, or
    fp32 summed in another order) the rest of the request differs, so this
    says how soon an engine drifts, where `agreement` only says whether.
    """
    shares = []
    for a, b in zip(tokens, reference):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        shares.append(same / len(b))
    return sum(shares) / len(shares)
