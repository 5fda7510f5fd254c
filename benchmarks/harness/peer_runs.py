"""Starting one engine of roseinfer.bench.peers.ENGINES on a set of workloads (benchmarks/compare_engines.py).

A runner reads a JSON spec and writes JSON results (benchmarks/peers/runner_io.py),
so no engine's libraries, threads or allocator ever share a process with another's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from roseinfer.bench.peers import PEERS_DIR, Engine

BENCHMARKS_DIR = Path(__file__).resolve().parents[1]
RUNNERS_DIR = BENCHMARKS_DIR / "peers"


def engine_env(engine: Engine, threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if engine.venv is None:  # the project's runners import roseinfer from this checkout, and the harness
        paths = [str(BENCHMARKS_DIR.parent), str(BENCHMARKS_DIR), env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
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
