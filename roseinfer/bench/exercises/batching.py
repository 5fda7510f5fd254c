"""Notebook 02's exercise: a step's sequences packed into one flat batch, as ModelRunner.prepare packs them."""

from __future__ import annotations

from collections.abc import Callable

PACK_CASES = (  # (new token ids, start_pos) per sequence; a sequence's ids name it: 11, 12 ... are sequence 1's
    ("prefills of 5, 2 and 3 tokens", [([11, 12, 13, 14, 15], 0), ([21, 22], 0), ([31, 32, 33], 0)]),
    ("decodes at 7, 3 and 12 cached tokens", [([17], 7), ([23], 3), ([34], 12)]),
    ("a prefill of 4, a decode at 9, a prefill of 3, a decode at 5",
     [([11, 12, 13, 14], 0), ([29], 9), ([31, 32, 33], 0), ([45], 5)]),
)
PACK_FIELDS = ("input_ids", "positions", "query_start_loc", "context_lens", "last_rows")


def _pack_engine(seqs) -> dict[str, list[int]]:
    """What the engine's ModelRunner.prepare builds for these sequences. prepare reads only the runner's block size
    and device, so a stand-in runner serves (no model, no KV cache)."""
    from types import SimpleNamespace

    import torch

    from roseinfer.engine.batch import BatchEntry
    from roseinfer.engine.runner import ModelRunner

    runner = SimpleNamespace(block_size=4, device=torch.device("cpu"))
    entries = [BatchEntry(list(ids), start, list(range(8)), True, None, None) for ids, start in seqs]
    input_ids, positions, meta, sample_rows = ModelRunner.prepare(runner, entries)
    return {"input_ids": input_ids.tolist(), "positions": positions.tolist(),
            "query_start_loc": meta.query_start_loc.tolist(), "context_lens": meta.context_lens.tolist(),
            "last_rows": sample_rows.tolist()}


def _pack_mistake(name: str, got: list[int], seqs, want: dict[str, list[int]]) -> str:
    """Names the mistake behind a wrong `name` field, given the right ones."""
    import itertools

    lens = [len(ids) for ids, _ in seqs]
    starts = [start for _, start in seqs]
    offsets = want["query_start_loc"]
    if name == "input_ids":
        if len(got) == len(seqs) * max(lens):
            return (f"padded: {len(got)} ids for {sum(lens)} new tokens, every sequence filled up to the longest; a "
                    "packed batch has no padding: the sequences' tokens one after another")
        if sorted(got) == sorted(want["input_ids"]) and any(
                got == [t for j in order for t in seqs[j][0]] for order in itertools.permutations(range(len(seqs)))):
            return ("sequences reordered: keep the batch's order (the runner hands the i-th sampled token back to the "
                    "i-th entry)")
        return "expected every sequence's new tokens, one sequence after another, in the batch's order"
    if name == "positions":
        if got == [p for n in lens for p in range(n)]:
            return ("positions restart at 0 in every sequence: a token's position counts the tokens already cached, "
                    "start_pos, start_pos + 1, ...; a decode token at 0 is read as its sequence's first token")
        if got == list(range(sum(lens))):
            return "positions run on across sequences: each sequence counts from its own start_pos"
        if got == [s + 1 + p for s, n in zip(starts, lens) for p in range(n)]:
            return ("off by one: the first new token's position is start_pos (the number of tokens before it), not "
                    "start_pos + 1")
        return "expected start_pos, start_pos + 1, ... for each sequence's new tokens"
    if name == "query_start_loc":
        if got in (offsets[1:], offsets[:-1]):
            return (f"{len(got)} offsets for {len(seqs)} sequences: there are B + 1, from 0 to the number of tokens, "
                    "so that sequence i's tokens are input_ids[query_start_loc[i]:query_start_loc[i + 1]]")
        if got == lens:
            return "these are the sequences' lengths: the offsets are their running sum, starting at 0"
        if got in ([o - 1 for o in offsets], [o + 1 for o in offsets], [0] + [o - 1 for o in offsets[1:]]):
            return "offsets off by one: query_start_loc[i + 1] - query_start_loc[i] must be sequence i's new tokens"
        return "expected 0, then the running sum of the sequences' new-token counts"
    if name == "context_lens":
        if got == lens:
            return ("the new tokens only: a sequence also attends to the tokens already in its cache, start_pos + its "
                    "new tokens")
        if got == starts:
            return ("the cache before this step: each new token's key joins the cache and is attended to too, "
                    "start_pos + its new tokens")
        if got in ([s + n - 1 for s, n in zip(starts, lens)], [s + n + 1 for s, n in zip(starts, lens)]):
            return "off by one: a sequence attends to start_pos + its new tokens, itself included"
        return "expected start_pos + the new tokens, per sequence"
    if got == offsets[:-1]:
        return ("sampled the first token of each sequence: a prompt's next token comes from the logits of its last "
                "token, query_start_loc[i + 1] - 1")
    if got == [n - 1 for n in lens]:
        return ("indices within each sequence: the logits are computed for the packed rows, so the last token of "
                "sequence i is row query_start_loc[i + 1] - 1")
    if got == offsets[1:]:
        return ("off by one: query_start_loc[i + 1] is the next sequence's first token; sequence i's last is "
                "query_start_loc[i + 1] - 1")
    return "expected the packed row of each sequence's last new token"


def _pack_ints(value) -> list[int] | None:
    """A flat sequence of ints (a list, a tensor, an array) as a list; None if it is not one."""
    value = value.tolist() if hasattr(value, "tolist") else value
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):  # not iterable, or nested (one row per sequence)
        return None


def check_pack_batch(pack: Callable) -> str:
    """Notebook 02: `pack(seqs)` is the heart of ModelRunner.prepare. `seqs` lists each sequence of a step as
    (token_ids, start_pos): the new tokens it computes now and how many of its tokens the KV cache holds already (0
    for a prompt; for a decode, the tokens so far). It must return five flat sequences of ints,
    (input_ids, positions, query_start_loc, context_lens, last_rows):

    - input_ids: every sequence's new tokens, one sequence after another, in the given order (packed, not padded);
    - positions: each token's position in its own sequence: start_pos, start_pos + 1, ...;
    - query_start_loc: B + 1 offsets: sequence i's tokens are input_ids[query_start_loc[i]:query_start_loc[i + 1]];
    - context_lens: how many tokens each sequence attends to after this step (cached + new);
    - last_rows: the row in input_ids of each sequence's last new token, whose logits are sampled.

    Compared with what ModelRunner.prepare builds for prefills of different lengths, decodes, and a mix of both."""
    for what, seqs in PACK_CASES:
        try:
            out = pack([(list(ids), start) for ids, start in seqs])
        except NotImplementedError:
            return "not written yet: replace the `raise NotImplementedError` with your packing"
        except Exception as exc:
            return f"FAIL: on {what} it raised {type(exc).__name__}: {exc}"
        if not isinstance(out, (tuple, list)) or len(out) != len(PACK_FIELDS):
            got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
            return f"FAIL: expected a tuple of five, ({', '.join(PACK_FIELDS)}), got {got}"
        want = _pack_engine(seqs)
        for name, value in zip(PACK_FIELDS, out):
            got = _pack_ints(value)
            if got is None:
                nested = " (one row per sequence is padding: the batch is packed)" if name == "input_ids" else ""
                return f"FAIL: {name} must be one flat sequence of ints{nested}"
            if got != want[name]:
                return (f"FAIL: {what}: {name} {got}, the engine's {want[name]}: "
                        f"{_pack_mistake(name, got, seqs, want)}")
    return ("PASS: prefills of different lengths, decodes and a mix packed as ModelRunner.prepare packs them: the "
            "tokens one sequence after another, each at its own position, B + 1 offsets, each context cached + new, "
            "the last token of each sequence sampled")
