"""Small helpers that keep the notebooks about their subject.

- `show_source` prints the code of a before and an after side by side (one after the other);
- `sizes` picks the CPU or the GPU parameters of a notebook, shrunk to CI sizes
  under `ROSEINFER_NOTEBOOK_SIZES=tiny` (nbval runs the CPU branch so, and the
  virtual-CUDA test the GPU branch);
- `verdict` (from `bench.stats`) compares two lists of repeated runs: a rank
  test with a stated error rate for whether they differ, a bootstrap interval
  for by how much; its `better`/`worse` are what a notebook asserts;
- `reference` loads a GPU reference result committed under results/<gpu>/;
- `save` writes a result JSON (and its figure) under results/<device>/.
"""

from __future__ import annotations

import inspect
import os
import textwrap
from pathlib import Path
from typing import Any

import torch

from roseinfer.bench import plots
from roseinfer.bench.diff import show_branch_diff, show_diff  # noqa: F401  (re-exported for the notebooks)
from roseinfer.bench.results import make_result, read_json, repo_root, results_dir, results_root, write_json
from roseinfer.bench.stats import Verdict, median, verdict  # noqa: F401  (re-exported for the notebooks)

GPU_TAGS = ("h100", "h200")


def show_source(*objects: Any) -> None:
    for obj in objects:
        name = getattr(obj, "__qualname__", repr(obj))
        module = getattr(inspect.getmodule(obj), "__name__", "?")
        print(f"# --- {module}.{name} " + "-" * max(0, 60 - len(module) - len(name)))
        print(textwrap.dedent(inspect.getsource(obj)))


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def tiny() -> bool:
    """Whether the notebooks run at CI sizes (ROSEINFER_NOTEBOOK_SIZES=tiny), where timings mean nothing."""
    return os.environ.get("ROSEINFER_NOTEBOOK_SIZES") == "tiny"


def sizes(cpu: dict[str, Any], gpu: dict[str, Any], ci: dict[str, Any] | None = None) -> dict[str, Any]:
    """The notebook's parameters: small on a CPU, full size where CUDA is present.

    Under ROSEINFER_NOTEBOOK_SIZES=tiny, the device's parameters with `ci`'s
    overrides: the same code path at a size CI can afford (`make test` runs
    every notebook so, on the CPU under nbval and on virtual CUDA). Numbers
    measured so mean nothing, and the notebooks assert no direction on them.
    """
    chosen = gpu if device() == "cuda" else cpu
    if tiny():
        chosen = dict(chosen, **(ci or {}))
    return dict(chosen, device=device())


def reference(name: str) -> tuple[str, dict[str, Any]] | None:
    """(gpu tag, result) of the committed GPU reference run `name`.json, if there is one."""
    for tag in GPU_TAGS:
        path = repo_root() / "results" / tag / f"{name}.json"
        if path.exists():
            return tag, read_json(path)
    return None


def save(
    name: str, variant: str, config: dict[str, Any], metrics: dict[str, Any], fig=None, measured_on: str | None = None
) -> Path:
    """Write results/<device>/<name>.json (and .png when a figure is given).

    `measured_on` names the device the figures come from when it is not the notebook's own (notebook 11
    times the CPU even where CUDA is present): its results then go under results/cpu, with the CPU's name.
    A run at tiny sizes writes under results/tiny/<device>/: its numbers never replace real ones.
    """
    where = measured_on or device()
    out = results_dir(where, results_root() / "tiny" if tiny() else None) / f"{name}.json"
    write_json(out, make_result(name, variant, config, metrics, where))
    if fig is not None:
        plots.save(fig, out.with_suffix(".png"))
    return out
