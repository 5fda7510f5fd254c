"""Result files: every benchmark writes JSON with the same envelope.

    {"benchmark", "variant", "config", "metrics", "device", "device_name",
     "torch_version", "git_commit", "date"}

Files go under results/<device>/, where <device> is "cpu" or a short GPU tag
("h100", "h200", ...), so CPU runs and GPU reference runs sit side by side.
results/ is the checkout's (`repo_root()`) unless ROSEINFER_RESULTS_DIR names another.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from roseinfer.cpu_class import emulated_class


def _is_checkout(path: Path) -> bool:
    return (path / "pyproject.toml").is_file() and (path / "roseinfer").is_dir()


def repo_root(start: str | Path | None = None) -> Path:
    """The roseinfer checkout `start` (default: the working directory) sits in: the nearest directory
    up from it with pyproject.toml and roseinfer/. Outside any checkout, the one this package is
    installed from in editable mode, else the working directory itself."""
    here = Path(start or Path.cwd()).resolve()
    for path in (here, *here.parents, *Path(__file__).resolve().parents):
        if _is_checkout(path):
            return path
    return here


def __getattr__(name: str) -> Any:
    # `REPO_ROOT`, looked up when asked for (the notebooks and scripts read it), not fixed at import.
    if name == "REPO_ROOT":
        return repo_root()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def device_name(device: str | torch.device = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    except OSError:
        fields = {}
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if "model name" in fields:
        # A virtual machine's processor name can be as bare as "AMD EPYC": its family and model tell two
        # generations apart (AMD family 25 is Zen 3/4, 26 is Zen 5), whose figures must not be compared.
        generation = f" family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else ""
        return f"{fields['model name']}{generation} ({torch.get_num_threads()} threads)"
    return platform.processor() or platform.machine() or "cpu"


# The processor features that decide which fast paths an engine can take.
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


def cpu_info() -> dict[str, Any]:
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    # emulated_class: the narrower class this run stood in for (roseinfer.cpu_class), None on the CPU as it is
    return {"cpu_model": model, "cpu_flags": {f: f in flags for f in CPU_FLAGS}, "emulated_class": emulated_class()}


def boot_id() -> str:
    """This boot of this machine. Two virtual machines can report the same processor name and
    features and still run at very different speeds (different hosts, different neighbours), so a
    measurement kept "per machine" is kept per boot: a new session's machine measures its own."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return platform.node()


def device_tag(device: str | torch.device = "cpu") -> str:
    """'cpu', or the GPU's short name: 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    for tag in ("h200", "h100", "a100", "l40s", "l4", "a10g", "b200", "rtx 4090"):
        if tag in name:
            return tag.replace(" ", "")
    return name.replace("nvidia", "").strip().split()[0]


def results_root() -> Path:
    """results/ in the checkout; ROSEINFER_RESULTS_DIR redirects writes (the test run uses a temp dir,
    so executing the notebooks under nbval does not overwrite the committed reference results)."""
    return Path(os.environ.get("ROSEINFER_RESULTS_DIR") or repo_root() / "results")


def results_dir(device: str | torch.device = "cpu", root: Path | None = None) -> Path:
    """results/<device>/, or results/cpu-<class>/ for a CPU run standing in for a narrower class
    (roseinfer.cpu_class): its figures never overwrite, or sit beside, the machine's own."""
    tag = device_tag(device)
    if tag == "cpu" and emulated_class():
        tag = f"cpu-{emulated_class()}"
    path = (root or results_root()) / tag
    path.mkdir(parents=True, exist_ok=True)
    return path


def git_commit() -> str | None:
    """HEAD's short hash, with "+dirty" when the engine's or the benchmarks' code differs from it (a result then
    came from code no commit holds). Notebooks are not looked at: re-executing them rewrites them."""
    root = repo_root()
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "roseinfer", "benchmarks"], cwd=root, capture_output=True,
            text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return (commit + ("+dirty" if changed.stdout.strip() else "")) if commit else None


def make_result(
    benchmark: str,
    variant: str,
    config: dict[str, Any],
    metrics: dict[str, Any],
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    return {
        "benchmark": benchmark,
        "variant": variant,
        "config": config,
        "metrics": metrics,
        "device": device_tag(device),
        "device_name": device_name(device),
        "torch_version": torch.__version__,
        "git_commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_json(path: str | Path, payload: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())
