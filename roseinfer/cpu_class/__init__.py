"""Run a command on this CPU as a narrower CPU class would: the instruction sets roseinfer is measured on.

The machines roseinfer is built and measured on change kind (AVX2-only, AVX-512, AVX512-BF16, AMX), and a
fast path must not lose to the plain one on any of them. A wider CPU can stand in for a narrower class's
*instruction set*:

    python -m roseinfer.cpu_class avx2 -- python benchmarks/benchmark_cpu_linear.py --rows 1 4

runs the command with
- `ATEN_CPU_CAPABILITY`: ATen's vectorized kernels (layer norms, GELU, softmax...) at that width;
- `ONEDNN_MAX_CPU_ISA`: oneDNN (the packed projections) limited to that ISA;
- `ROSEINFER_KERNEL_MARCH`: roseinfer's C kernels built for the class (`-march=x86-64-v3` for AVX2,
  `x86-64-v4` for AVX-512) instead of `-march=native`, cached apart from the native build;
- `CT2_FORCE_CPU_ISA`: CTranslate2's kernels (a peer in benchmarks/compare_engines.py) at that width;
- `ROSEINFER_CPU_CLASS`: roseinfer's own checks (`config.native_bf16_cpu`, `config.amx_bf16_cpu`) answer
  for the class, so the default dtype and the kernel choices are the class's.

vLLM-CPU's and llama.cpp's own kernels are built for the machine and have no such cap: compare_engines.py
skips them under a class. What it cannot stand in for is the narrower CPU's cores, caches and memory (an AVX2 laptop is not a
Zen 5 server held to 256-bit vectors): compare kernels with each other under one class on one machine,
as ratios, and never put a figure taken so beside one from a real machine of that class.
`python -m roseinfer.cpu_class avx2` with no command prints the settings.
"""

from __future__ import annotations

import os

CLASSES = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ROSEINFER_KERNEL_MARCH": "x86-64-v3",
             "CT2_FORCE_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "ROSEINFER_KERNEL_MARCH": "x86-64-v4", "CT2_FORCE_CPU_ISA": "AVX512"},
}


def emulated_class() -> str | None:
    """The class this process runs as (ROSEINFER_CPU_CLASS), or None on the CPU as it is."""
    name = os.environ.get("ROSEINFER_CPU_CLASS") or None
    if name is not None and name not in CLASSES:
        raise ValueError(f"ROSEINFER_CPU_CLASS={name!r}; known classes: {', '.join(CLASSES)}")
    return name


def class_env(name: str) -> dict[str, str]:
    if name not in CLASSES:
        raise ValueError(f"unknown CPU class {name!r}; known: {', '.join(CLASSES)}")
    return dict(CLASSES[name], ROSEINFER_CPU_CLASS=name)
