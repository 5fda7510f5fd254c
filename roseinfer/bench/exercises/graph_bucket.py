"""Notebook 09's exercise: the captured CUDA graph that a decode step of a given batch replays."""

from __future__ import annotations

from collections.abc import Callable


def check_graph_bucket(choose: Callable) -> str:
    """Notebook 09: `choose(buckets, batch)` picks the captured graph a decode step of `batch` rows replays, as
    DecodeGraphs.bucket_for does: the smallest bucket that holds every row, and how many padding rows fill it,
    as (bucket, padded rows); None where the batch is larger than every bucket (that step runs eagerly).
    `buckets` are sorted, as graph_buckets gives them."""
    from roseinfer.engine.cuda_graphs import graph_buckets

    try:
        for largest in (64, 16, 5):
            buckets = graph_buckets(largest)
            for batch in range(1, largest + 2):
                verdict = _check_bucket(choose, list(buckets), batch)
                if verdict:
                    return verdict
    except NotImplementedError:
        return "not written yet: replace the `raise NotImplementedError` with your choice"
    return ("PASS: every batch goes to the smallest captured graph that holds it, padded to its size; a batch "
            "larger than every graph runs eagerly")


def _check_bucket(choose: Callable, buckets: list[int], batch: int) -> str | None:
    fits = [b for b in buckets if b >= batch]
    expected = (fits[0], fits[0] - batch) if fits else None
    try:
        got = choose(buckets, batch)
    except NotImplementedError:
        raise
    except Exception as exc:
        if expected is None:
            return (f"FAIL: a batch of {batch}, larger than every graph ({buckets[-1]} rows), raised "
                    f"{type(exc).__name__}: return None, and the step runs eagerly")
        return f"FAIL: buckets {buckets}, a batch of {batch}: it raised {type(exc).__name__}: {exc}"
    if got == expected:
        return None
    if expected is None:
        return (f"FAIL: a batch of {batch} is larger than every graph ({buckets[-1]} rows), yet it returned "
                f"{got!r}: no graph holds its rows; return None, and the step runs eagerly")
    if not (isinstance(got, tuple) and len(got) == 2):
        return f"FAIL: a batch of {batch}: expected (bucket, padded rows), got {got!r}"
    bucket, padded = got
    if bucket not in buckets:
        return f"FAIL: a batch of {batch} went to {bucket!r}, which is not a captured size ({buckets})"
    if bucket < batch:
        return (f"FAIL: a batch of {batch} went to the graph of {bucket} rows: a replay computes exactly the rows "
                "it captured, so rows would be lost; take the smallest bucket that holds the batch")
    if bucket > expected[0]:
        exact = " exactly" if expected[1] == 0 else ""
        return (f"FAIL: a batch of {batch} went to the graph of {bucket} rows where the {expected[0]}-row graph "
                f"holds it{exact}: every padding row is computed and thrown away; take the smallest that holds it")
    return (f"FAIL: a batch of {batch} in the {bucket}-row graph leaves {expected[1]} padding rows (the bucket's "
            f"rows less the batch's), not {padded!r}")
