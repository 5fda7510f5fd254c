"""The runtime never imports the measuring code, the earlier versions or the test harness.

`pip install roseinfer` brings no matplotlib (it is the `bench` extra), so the engine and the
server must run without it; history/ and testing/ are the notebooks' and the tests' business.
Each check runs in a fresh interpreter: this test process has imported everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

FORBIDDEN = ("matplotlib", "roseinfer.bench", "roseinfer.history", "roseinfer.testing")

IMPORT_RUNTIME = """
import importlib, roseinfer
try:
    importlib.import_module("roseinfer.server.app")
except ModuleNotFoundError as e:
    if e.name != "roseinfer.server.app":
        raise
    importlib.import_module("roseinfer.server.api")
"""
# Every module of the runtime (the command-line entry points included: their main() runs only as __main__).
# A module that needs a library this machine lacks (triton on a CPU-only machine) is passed over.
IMPORT_EVERY_RUNTIME_MODULE = """
import importlib, pkgutil, roseinfer
NOT_RUNTIME = ("roseinfer.bench", "roseinfer.history", "roseinfer.testing", "roseinfer.benchmark_")
def visit(package):  # pkgutil.walk_packages would import history/ and bench/ to look inside them
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if info.name.startswith(NOT_RUNTIME):
            continue
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            if (e.name or "roseinfer").startswith("roseinfer"):
                raise
            continue
        if info.ispkg:
            visit(module)
visit(roseinfer)
"""
BUILD_ENGINE = """
from roseinfer import InferenceEngine
InferenceEngine.from_pretrained("gpt2-tiny", offline=True).generate([[1, 2, 3]])
"""


def imported_after(code: str) -> dict[str, list[str]]:
    """Which modules of FORBIDDEN (and their submodules) a fresh interpreter holds after `code`."""
    probe = code + f"""
import json, sys
print(json.dumps({{p: sorted(m for m in sys.modules if m == p or m.startswith(p + ".")) for p in {FORBIDDEN!r}}}))
"""
    # Not under virtual CUDA, which roseinfer/__init__.py switches on from roseinfer.testing on request.
    env = {k: v for k, v in os.environ.items() if k != "ROSEINFER_VIRTUAL_CUDA"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runtime_modules() -> dict[str, list[str]]:
    return imported_after(IMPORT_RUNTIME + BUILD_ENGINE)


def test_no_runtime_module_imports_them():
    found = imported_after(IMPORT_EVERY_RUNTIME_MODULE)
    assert found == {package: [] for package in FORBIDDEN}, found


@pytest.mark.parametrize("package", ["matplotlib", "roseinfer.bench"])
def test_runtime_does_not_import_the_measuring_code(runtime_modules, package):
    assert runtime_modules[package] == [], f"the runtime imported {runtime_modules[package]}"


@pytest.mark.parametrize("package", ["roseinfer.history", "roseinfer.testing"])
def test_runtime_does_not_import_history_or_testing(runtime_modules, package):
    assert runtime_modules[package] == [], f"the runtime imported {runtime_modules[package]}"


def test_seed_commands_and_notebook_helpers_import_without_matplotlib():
    """plots imports matplotlib only when it draws: a notebook helper, a seed command import without it."""
    found = imported_after(
        "import roseinfer.bench.notebook, roseinfer.bench.plots, roseinfer.benchmark_scheduler, "
        "roseinfer.benchmark_streaming"
    )
    assert found["matplotlib"] == []
