"""Solutions of the notebooks' exercises (roseinfer.bench.exercises checks them). Try first."""

from __future__ import annotations

import hashlib


def prefix_router(prompt: str, replicas: list[str]) -> str:
    """Notebook 13: hash what is shared (the system prompt, before "\\nUser:"), so it always lands on one replica.
    A stable hash (not Python's `hash`, salted per process) keeps the choice across gateway restarts."""
    system = prompt.split("\nUser:")[0]
    return replicas[int(hashlib.sha256(system.encode()).hexdigest(), 16) % len(replicas)]
