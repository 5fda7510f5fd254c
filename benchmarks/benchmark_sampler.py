"""Drawing sampled tokens: an exponential race against the inverse-CDF lookup roseinfer uses.

    python benchmarks/benchmark_sampler.py --rows 1 16 32 64

Both draw one token per row from the same probabilities [rows, 50257]
(GPT-2's vocabulary): the race draws an Exp(1) number for every token of every
row and takes argmax(p / E); the lookup (roseinfer.sampling.inverse_cdf_sample)
draws one uniform number per row. Interleaved repeats; medians and the spread.
Also the whole Sampler call (temperature, softmax, draw) for context. Writes
results/<device>/sampler.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch

from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.sampling import Sampler, SamplingParams, inverse_cdf_sample

VOCAB = 50257


def exponential_race_sample(
    probs: torch.Tensor, generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """The draw roseinfer used before: argmax(p / E) with E ~ Exp(1) per token draws from p."""
    noise = torch.empty_like(probs).exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # a zero draw would make 0/0 = NaN
    return (probs / noise).argmax(dim=-1)


def time_us(fn: Callable[[], object], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32, 64])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--inner", type=int, default=10)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    sampler = Sampler()
    results = []
    with torch.inference_mode():
        for rows in args.rows:
            logits = torch.randn(rows, VOCAB) * 3
            probs = logits.softmax(dim=-1)
            generators = [None] * rows
            params = [SamplingParams(temperature=1.0)] * rows
            variants = {
                "exponential_race_us": partial(exponential_race_sample, probs, generators),
                "inverse_cdf_us": partial(inverse_cdf_sample, probs, generators),
                "sampler_call_us": partial(sampler, logits, params, generators),
            }
            runs: dict[str, list[float]] = {name: [] for name in variants}
            for fn in variants.values():
                fn()  # warm-up
            for _ in range(args.repeats):  # interleaved
                for name, fn in variants.items():
                    runs[name].append(time_us(fn, args.inner))
            row = {"rows": rows, **{name: statistics.median(v) for name, v in runs.items()}}
            row["runs"] = runs
            row["speedup"] = row["exponential_race_us"] / row["inverse_cdf_us"]
            # Back of the envelope: the race draws rows x 50,257 random numbers, the lookup `rows` of them.
            row["race_ns_per_draw"] = row["exponential_race_us"] * 1e3 / (rows * VOCAB)
            results.append(row)
            print(
                f"{rows:>3} rows: exponential race {row['exponential_race_us']:8.0f} us "
                f"(range {min(runs['exponential_race_us']):.0f}-{max(runs['exponential_race_us']):.0f}, "
                f"{row['race_ns_per_draw']:.1f} ns a random number), inverse CDF {row['inverse_cdf_us']:6.0f} us "
                f"(range {min(runs['inverse_cdf_us']):.0f}-{max(runs['inverse_cdf_us']):.0f}): "
                f"{row['speedup']:.0f}x; whole Sampler call {row['sampler_call_us']:.0f} us"
            )
    out = results_dir("cpu") / "sampler.json"
    write_json(
        out, make_result("sampler", "exponential-race-vs-inverse-cdf", vars(args), {"rows": results}, "cpu")
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
