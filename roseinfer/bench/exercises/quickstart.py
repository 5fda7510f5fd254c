"""Notebook 00's exercise: the greedy loop, written over the model's logits, against the engine's `generate`."""

from __future__ import annotations

from collections.abc import Callable


def check_greedy_loop(greedy: Callable, engine, n: int = 6) -> str:
    """Notebook 00: `greedy(engine, token_ids, n)` must return the n tokens greedy decoding gives after the prompt
    `token_ids` (a list of ints), calling `engine.prompt_logits(ids)` (logits [len(ids), vocab]) once a token.
    The reference is `engine.generate` at temperature 0 with EOS ignored."""
    from roseinfer import SamplingParams

    for text in ("Hello, my name is", "The capital of France is"):
        prompt = engine.tokenizer.encode(text)
        want = engine.generate([prompt], SamplingParams(max_new_tokens=n, stop_on_eos=False))[0].token_ids
        try:
            got = greedy(engine, list(prompt), n)
        except NotImplementedError:
            return "not written yet: replace the `raise NotImplementedError` with your loop"
        got = [int(t) for t in got] if got is not None else None
        if got is None:
            return "your function returned None: return the list of new tokens"
        if got[: len(prompt)] == prompt and len(got) == len(prompt) + n:
            return "you returned the prompt too: return only the new tokens"
        if len(got) != n:
            return f"{len(got)} tokens for n = {n}: return exactly n new tokens"
        if got == want:
            continue
        first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        if first == 0:
            hint = "the first token already differs: take the argmax of the LAST position's logits"
        else:
            hint = "append each chosen token to the ids before the next call"
        return f"{text!r}: token {first} is {got[first]}, greedy gives {want[first]} ({hint})"
    return f"PASS: your loop gives generate's {n} greedy tokens on both prompts"
