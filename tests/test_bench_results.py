"""Where results go: the checkout found from the working directory, not from where the package sits."""

from __future__ import annotations

import os
from pathlib import Path

from roseinfer.bench import results

ROOT = Path(__file__).resolve().parents[1]


def fake_checkout(path: Path) -> Path:
    (path / "roseinfer").mkdir(parents=True)
    (path / "pyproject.toml").write_text("[project]\nname = 'roseinfer'\n")
    return path


def test_repo_root_is_the_checkout_above_the_working_directory(tmp_path, monkeypatch):
    checkout = fake_checkout(tmp_path / "clone")
    (checkout / "notebooks").mkdir()
    assert results.repo_root(checkout / "notebooks") == checkout
    monkeypatch.chdir(checkout / "notebooks")  # where a notebook's kernel runs
    assert results.repo_root() == checkout
    assert checkout == results.REPO_ROOT  # read by the notebooks: looked up when asked for
    monkeypatch.delenv("ROSEINFER_RESULTS_DIR", raising=False)
    assert results.results_root() == checkout / "results"
    monkeypatch.setenv("ROSEINFER_RESULTS_DIR", str(tmp_path / "elsewhere"))
    assert results.results_dir("cpu") == tmp_path / "elsewhere" / "cpu"
    assert results.results_dir("cpu", root=tmp_path / "given") == tmp_path / "given" / "cpu"


def test_repo_root_outside_any_checkout(tmp_path):
    # This package is installed in editable mode from ROOT, so ROOT is the checkout to fall back on;
    # an installed wheel has none, and the working directory is used.
    assert results.repo_root(tmp_path) in (ROOT, tmp_path.resolve())


def test_peer_runners_find_roseinfer_and_the_harness():
    from harness.peer_runs import BENCHMARKS_DIR, engine_env

    from roseinfer.bench.peers import ENGINES

    paths = engine_env(ENGINES["hf"], threads=1)["PYTHONPATH"].split(os.pathsep)
    assert str(BENCHMARKS_DIR.parent) in paths and str(BENCHMARKS_DIR) in paths
    assert BENCHMARKS_DIR == ROOT / "benchmarks"
