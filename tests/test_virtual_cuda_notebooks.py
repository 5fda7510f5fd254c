"""Every notebook's GPU branch, at CI sizes, on virtual CUDA.

nbval runs the notebooks as a CPU reader sees them; here each notebook's code
cells run again in this process with `ROSEINFER_NOTEBOOK_SIZES=tiny` (its GPU
parameters, shrunk) under virtual CUDA, so the `if P["device"] == "cuda"`
branches, `device=P["device"]` engines and servers started with `--device
cuda` all execute, and a tensor or generator on the wrong device fails the
notebook with the cell and line. Servers the notebooks start inherit the
mode through `virtual_cuda.process_env()`. What this cannot check is the GPU's
numbers: timings taken here are of a CPU and are thrown away.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

REPO = Path(__file__).resolve().parents[1]
# The notebooks with a device to switch: one that never names a device (13's servers are CPU processes) has no
# GPU branch, and nbval already runs it as it is.
NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb")
                   if "notebook.sizes(" in p.read_text() and "device" in p.read_text())


def run_code_cells(path: Path) -> dict:
    """Execute a notebook's code cells in order in one namespace; errors name the cell and line."""
    namespace: dict = {"__name__": "__main__"}
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            exec(compile(source, f"notebooks/{path.name}[cell {index}]", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_gpu_branch_at_tiny_sizes(name, virtual_cuda, monkeypatch, tmp_path):
    import matplotlib.pyplot as plt

    monkeypatch.setenv("ROSEINFER_NOTEBOOK_SIZES", "tiny")
    # The torch reference attention wherever a notebook does not name a backend: under Triton's interpreter a
    # decode step takes tens of ms, which was nine tenths of this test. The Triton kernel runs on virtual CUDA
    # in notebooks 08 and 09, which name it, and in tests/test_virtual_cuda_engine.py.
    monkeypatch.setenv("ROSEINFER_ATTENTION_BACKEND", "torch")
    from roseinfer.testing.virtual_cuda import process_env

    for key in ("ROSEINFER_VIRTUAL_CUDA", "PYTHONPATH"):  # for the servers a notebook starts
        monkeypatch.setenv(key, process_env()[key])
    monkeypatch.setenv("ROSEINFER_RESULTS_DIR", str(tmp_path))
    monkeypatch.chdir(REPO / "notebooks")
    try:
        namespace = run_code_cells(REPO / "notebooks" / name)
    finally:
        plt.close("all")
    assert namespace["P"]["device"] == "cuda"
