"""The engines benchmarks/compare_engines.py can run, and whether each is installed here.

Each engine is a runner script in benchmarks/peers/ started by some
virtualenv's python: roseinfer and HF by the project's own interpreter, the
peers by theirs under .peers/<venv>/ (made by `make peers`). Starting one is
the harness's part (benchmarks/harness/peer_runs.py); the registry is here
because notebook 13 asks it whether vLLM is installed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roseinfer.bench.results import repo_root

PEERS_DIR = repo_root() / ".peers"


@dataclass(frozen=True)
class Engine:
    name: str
    runner: str  # a file in benchmarks/peers/
    model_format: str  # "hf", "ct2-float32", "ct2-int8" or "gguf": see benchmarks/harness/peer_formats.py
    precision: str  # what its weights and matmuls are computed in
    venv: str | None = None  # .peers/<venv>; None: this interpreter (the project's)
    options: dict[str, Any] = field(default_factory=dict)
    # Whether roseinfer.cpu_class can hold its kernels to a narrower CPU class (vLLM's and llama.cpp's are
    # compiled for the machine, with no cap to set).
    class_capped: bool = True

    def python(self, peers_dir: Path = PEERS_DIR) -> Path:
        return Path(sys.executable) if self.venv is None else peers_dir / self.venv / "bin" / "python"

    def missing(self, peers_dir: Path = PEERS_DIR) -> str | None:
        """Why this engine cannot run here, or None."""
        from roseinfer.cpu_class import emulated_class

        if emulated_class() and not self.class_capped:
            return f"its kernels cannot be held to the emulated {emulated_class()} class (roseinfer.cpu_class)"
        # `make peers` stamps a virtualenv only once everything in it is installed.
        if self.venv is None or (peers_dir / self.venv / ".installed").is_file():
            return None
        return f"{peers_dir / self.venv} is not installed (run `make peer-{self.venv}`)"


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("roseinfer-fp32", "run_roseinfer.py", "hf", "fp32", options={"dtype": "float32"}),
        # Whatever InferenceEngine.from_pretrained picks for this processor when asked for no dtype.
        Engine("roseinfer-auto", "run_roseinfer.py", "hf", "auto", options={"dtype": None}),
        # int8 weights, one scale per output channel, fp32 arithmetic (EngineConfig.quantization)
        Engine("roseinfer-int8", "run_roseinfer.py", "hf", "int8", options={"quantization": "int8"}),
        Engine("hf", "run_hf.py", "hf", "fp32"),
        Engine("vllm-fp32", "run_vllm.py", "hf", "fp32", "vllm", {"dtype": "float32"}, class_capped=False),
        Engine("vllm-bf16", "run_vllm.py", "hf", "bf16", "vllm", {"dtype": "bfloat16"}, class_capped=False),
        Engine("ct2-fp32", "run_ct2.py", "ct2-float32", "fp32", "ct2", {"compute_type": "float32"}),
        Engine("ct2-int8", "run_ct2.py", "ct2-int8", "int8", "ct2", {"compute_type": "int8"}),
        Engine("llamacpp-f32", "run_llamacpp.py", "gguf", "fp32", "llamacpp", class_capped=False),
    )
}
REFERENCE = "roseinfer-fp32"  # the exact path: every other engine's greedy tokens are compared with it


def installed(
    registry: dict[str, Any], names: list[str], peers_dir: Path
) -> tuple[list[Any], dict[str, str]]:
    """The engines of `names` whose virtualenv is installed, and why each other one is not (said aloud)."""
    engines, skipped = [], {}
    for name in names:
        why = registry[name].missing(peers_dir)
        if why:
            print(f"skipping {name}: {why}")
            skipped[name] = why
        else:
            engines.append(registry[name])
    return engines, skipped
