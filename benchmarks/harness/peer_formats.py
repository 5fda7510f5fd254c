"""One set of weights for every engine in benchmarks/compare_engines.py and compare_served.py.

The seeded random weights in Hugging Face layout (roseinfer.bench.peer_models.make_hf_weights)
are converted into each peer's format with the peer's own converter, run by the
peer's own virtualenv:

    hf/            config.json, model.safetensors, vocab.json, merges.txt
    ct2-float32/   ct2-transformers-converter --quantization float32
    ct2-int8/      ct2-transformers-converter --quantization int8
    gguf/model-f32.gguf   llama.cpp's convert_hf_to_gguf.py --outtype f32

Everything is cached under a directory keyed by preset, seed and projection
scale, so only the first run pays for it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

GGUF_NAME = "model-f32.gguf"


def add_weights_arguments(p: argparse.ArgumentParser, peers_dir: Path) -> None:
    """The options that pick the shared weights and the peers' virtualenvs (compare_engines, compare_served)."""
    from roseinfer.config import PRESETS

    p.add_argument(
        "--preset", default="gpt2", choices=sorted(PRESETS), help="architecture of the random weights"
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the requests")
    p.add_argument(
        "--projection-scale",
        type=float,
        default=3.0,
        help="scales the random projections so greedy decoding does not repeat one token (see roseinfer.bench.peer_models)",
    )
    p.add_argument("--peers-dir", type=Path, default=peers_dir, help="where `make peers` put the virtualenvs")
    p.add_argument(
        "--weights-dir", type=Path, default=None, help="cache of the weights (default: under peers-dir)"
    )


def weights_cache(args: argparse.Namespace) -> Path:
    """Where the weights the options of add_weights_arguments name are cached."""
    return (
        args.weights_dir
        or args.peers_dir / "weights" / f"{args.preset}-seed{args.seed}-x{args.projection_scale:g}"
    )


def _converted(target: Path, command: list[str], log: Path) -> Path:
    """Run a converter into a temporary path and rename it into place, so a failure leaves no cache."""
    if target.exists():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.unlink(missing_ok=True)
    command = [str(partial) if part == "{out}" else part for part in command]
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"conversion failed ({' '.join(command[:3])} ...): see {log}")
    partial.rename(target)
    return target


def ct2_model(root: Path, hf_dir: Path, python: Path, quantization: str) -> Path:
    """A CTranslate2 model directory converted with the peer's own converter (float32 or int8)."""
    converter = python.parent / "ct2-transformers-converter"
    return _converted(
        root / f"ct2-{quantization}",
        [str(converter), "--model", str(hf_dir), "--quantization", quantization, "--output_dir", "{out}"],
        root / f"ct2-{quantization}.log",
    )


def gguf_model(root: Path, hf_dir: Path, python: Path, convert_script: Path) -> Path:
    """llama.cpp's f32 GGUF of the same weights (f32: its q8_0 GPT-2 crashed where this was first run)."""
    (root / "gguf").mkdir(parents=True, exist_ok=True)
    return _converted(
        root / "gguf" / GGUF_NAME,
        [str(python), str(convert_script), str(hf_dir), "--outtype", "f32", "--outfile", "{out}"],
        root / "gguf" / "convert.log",
    )
