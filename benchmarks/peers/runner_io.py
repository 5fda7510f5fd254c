"""The contract every peer runner keeps, so benchmarks/compare_engines.py can run any of them.

A runner is started as `python run_<peer>.py SPEC.json OUT.json` by the
peer's own virtualenv, so this file imports nothing but the standard library.
SPEC holds the model path, thread count, options, and the workloads: lists of
{"prompt": [token ids], "max_new_tokens": n}. The runner loads the model once,
warms each workload up on other prompts of the same lengths (first calls
allocate, compile and fill caches), then
times one generation of every request of each workload and writes

    {"engine": {name: version, ...},
     "workloads": {name: {"seconds": s, "output_tokens": n, "token_ids": [[...], ...]}}}

Greedy, EOS ignored: each request must come back with exactly its
max_new_tokens tokens; the harness checks the counts and compares the tokens.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Requests = list[dict[str, Any]]
Generate = Callable[[Requests], list[list[int]]]

# Enough requests to touch every code path a workload uses (its batch sizes, its lengths).
WARMUP_REQUESTS = 4
# Warm-up prompts are the first requests' with every id shifted, so that an
# engine with a prefix cache cannot serve the timed prompts from the warm-up.
WARMUP_ID_SHIFT = 1


def warmup_requests(requests: Requests) -> Requests:
    """The first requests with every id shifted, wrapping below the largest id they hold: ids the workload
    already uses, so valid for whatever vocabulary the model has."""
    bound = 1 + max(t for r in requests for t in r["prompt"])
    return [
        {**r, "prompt": [(t + WARMUP_ID_SHIFT) % bound for t in r["prompt"]]}
        for r in requests[:WARMUP_REQUESTS]
    ]


def run(load: Callable[[dict[str, Any]], tuple[Generate, dict[str, str]]]) -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    generate, versions = load(spec)
    results = {}
    for name, requests in spec["workloads"].items():
        generate(warmup_requests(requests))
        start = time.perf_counter()
        token_ids = generate(requests)
        seconds = time.perf_counter() - start
        results[name] = {
            "seconds": seconds,
            "output_tokens": sum(len(t) for t in token_ids),
            "token_ids": [list(map(int, t)) for t in token_ids],
        }
        print(
            f"{name}: {results[name]['output_tokens'] / seconds:.1f} output tok/s",
            file=sys.stderr,
            flush=True,
        )
    Path(sys.argv[2]).write_text(json.dumps({"engine": versions, "workloads": results}))
