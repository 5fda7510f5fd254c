"""The engines benchmarks/compare_engines.py can run, and how to run one.

Each engine is a runner script in benchmarks/peers/ started by some
virtualenv's python: roseinfer and HF by the project's own interpreter, the
peers by theirs under .peers/<venv>/ (made by `make peers`). A runner reads a
JSON spec and writes JSON results (benchmarks/peers/runner_io.py), so no
engine's libraries, threads or allocator ever share a process with another's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roseinfer.bench.results import REPO_ROOT

RUNNERS_DIR = REPO_ROOT / "benchmarks" / "peers"
PEERS_DIR = REPO_ROOT / ".peers"


@dataclass(frozen=True)
class Engine:
    name: str
    runner: str  # a file in benchmarks/peers/
    model_format: str  # "hf", "ct2-float32", "ct2-int8" or "gguf": see peer_models
    precision: str  # what its weights and matmuls are computed in
    venv: str | None = None  # .peers/<venv>; None: this interpreter (the project's)
    options: dict[str, Any] = field(default_factory=dict)

    def python(self, peers_dir: Path = PEERS_DIR) -> Path:
        return Path(sys.executable) if self.venv is None else peers_dir / self.venv / "bin" / "python"

    def missing(self, peers_dir: Path = PEERS_DIR) -> str | None:
        """Why this engine cannot run here, or None."""
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
        Engine("hf", "run_hf.py", "hf", "fp32"),
        Engine("vllm-fp32", "run_vllm.py", "hf", "fp32", "vllm", {"dtype": "float32"}),
        Engine("vllm-bf16", "run_vllm.py", "hf", "bf16", "vllm", {"dtype": "bfloat16"}),
        Engine("ct2-fp32", "run_ct2.py", "ct2-float32", "fp32", "ct2", {"compute_type": "float32"}),
        Engine("ct2-int8", "run_ct2.py", "ct2-int8", "int8", "ct2", {"compute_type": "int8"}),
        Engine("llamacpp-f32", "run_llamacpp.py", "gguf", "fp32", "llamacpp"),
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


def engine_env(engine: Engine, threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if engine.venv is None:  # the project's runners import roseinfer from this checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if engine.venv == "vllm":
        # vLLM pins its OpenMP threads to these cores; left to itself on 2 cores
        # it would keep one for its own front end. Its KV cache is sized in GiB.
        env.update(
            VLLM_TARGET_DEVICE="cpu",
            VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
            VLLM_CPU_KVCACHE_SPACE="2",
        )
    return env


def run_engine(
    engine: Engine,
    model_path: Path,
    workloads: dict[str, list[dict[str, Any]]],
    threads: int,
    work_dir: Path,
    tag: str,
    peers_dir: Path = PEERS_DIR,
) -> dict[str, Any]:
    """Start the engine's runner on every workload once; its results, or RuntimeError with the log's tail."""
    spec = {
        "model": str(model_path),
        "threads": threads,
        "options": engine.options,
        "workloads": workloads,
    }
    spec_file = work_dir / f"{engine.name}.spec.json"
    out_file = work_dir / f"{engine.name}-{tag}.out.json"
    log_file = work_dir / f"{engine.name}-{tag}.log"
    spec_file.write_text(json.dumps(spec))
    out_file.unlink(missing_ok=True)
    with log_file.open("w") as log:
        done = subprocess.run(
            [str(engine.python(peers_dir)), engine.runner, str(spec_file), str(out_file)],
            cwd=RUNNERS_DIR,
            env=engine_env(engine, threads),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if done.returncode != 0 or not out_file.is_file():
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{engine.name} exited with {done.returncode} (log {log_file}):\n{tail}")
    return json.loads(out_file.read_text())
