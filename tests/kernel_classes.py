"""The CPU classes the kernel tests build roseinfer's C kernels for: this CPU's (native), and on x86-64 the
AVX2 class's (x86-64-v3) and a portable build (plain x86-64), so every class's code runs on any machine."""

from __future__ import annotations

import platform


def build_classes() -> list[tuple[str, str | None]]:
    """(name, -march target or None for this CPU's own build)."""
    classes = [("native", None)]
    if platform.machine() in ("x86_64", "AMD64"):
        classes += [("avx2", "x86-64-v3"), ("portable", "x86-64")]
    return classes
