"""How long roseinfer's C kernels take to build on a fresh machine (an empty kernel cache).

    python benchmarks/benchmark_kernel_build.py        # 3 builds of each kernel, each into an empty cache

This is the one-off cost a first `make serve` (or first engine) pays before it is ready; later
starts load the cached library. Writes results/cpu/kernel_build.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.kernels.cpu import build as cpu_build
from roseinfer.kernels.cpu.bindings import BF16_KERNEL_SOURCE
from roseinfer.kernels.cpu.bindings import PAGED_DECODE_SOURCE as ATTENTION_SOURCE

KERNELS = {"paged attention (paged_decode.c)": ATTENTION_SOURCE, "bf16 projections (linear_bf16.c)": BF16_KERNEL_SOURCE}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    seconds = {name: [] for name in KERNELS}
    before = os.environ.get("ROSEINFER_KERNEL_CACHE")
    try:
        for _ in range(args.repeats):
            for name, source in KERNELS.items():
                with tempfile.TemporaryDirectory() as cache:
                    os.environ["ROSEINFER_KERNEL_CACHE"] = cache  # empty: the build happens
                    start = time.perf_counter()
                    lib = cpu_build.load_kernel_library(source, name, "nothing (benchmark)")
                    seconds[name].append(time.perf_counter() - start)
                    if lib is None:
                        print(f"{name}: did not build here")
                        return 1
    finally:
        if before is None:
            os.environ.pop("ROSEINFER_KERNEL_CACHE", None)
        else:
            os.environ["ROSEINFER_KERNEL_CACHE"] = before
    metrics = {name: {"median_s": statistics.median(v), "runs_s": v} for name, v in seconds.items()}
    for name, m in metrics.items():
        print(f"{name}: built in {m['median_s']:.2f} s (runs {', '.join(f'{s:.2f}' for s in m['runs_s'])})")
    out = results_dir("cpu") / "kernel_build.json"
    write_json(out, make_result("kernel_build", "fresh-cache", vars(args), metrics, "cpu"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
