"""Every production function a notebook or a test pins by its source still exists under its name.

A rename or a move then fails here, naming the seam, instead of as a diff in a
notebook's output under nbval.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from roseinfer.history import TEACHING_SEAMS


def resolve(path: str) -> Any:
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(path)


def test_the_seams_are_listed_once():
    assert len(TEACHING_SEAMS) == len(set(TEACHING_SEAMS))
    assert all(not path.startswith(("roseinfer.history", "roseinfer.bench")) for path in TEACHING_SEAMS)


@pytest.mark.parametrize("path", TEACHING_SEAMS)
def test_seam_exists(path: str):
    obj = resolve(path)
    assert inspect.isfunction(obj) or inspect.isclass(obj), f"{path} is a {type(obj).__name__}"
    assert inspect.getsource(obj).strip()


PIN_CALLS = {"show_diff", "show_source", "show_branch_diff", "source_diff", "branch_diff", "getsource"}
ROOT = Path(__file__).resolve().parent.parent


def _code_of(path: Path) -> list[str]:
    if path.suffix != ".ipynb":
        return [path.read_text()]
    cells = json.loads(path.read_text())["cells"]
    return [
        "\n".join(
            line for line in "".join(c["source"]).splitlines() if not line.lstrip().startswith(("%", "!"))
        )
        for c in cells
        if c["cell_type"] == "code"
    ]


def _imported_names(trees: list[ast.Module]) -> dict[str, str]:
    """Local name -> dotted path of what it names, for every roseinfer import in the trees."""
    names: dict[str, str] = {}
    for node in (n for t in trees for n in ast.walk(t)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):  # `import a.b` binds a; `import a.b as c` binds c to a.b
            names.update({a.asname: a.name for a in node.names if a.asname})
            names.update({a.name.split(".")[0]: a.name.split(".")[0] for a in node.names if not a.asname})
    return {local: dotted for local, dotted in names.items() if dotted.split(".")[0] == "roseinfer"}


def _pinned_objects(path: Path) -> list[tuple[str, Any]]:
    """(expression, object) for every argument of a pinning call in the file that names an import
    (the exception in place of the object where it no longer resolves)."""
    trees = []
    for code in _code_of(path):
        with contextlib.suppress(SyntaxError):
            trees.append(ast.parse(code))
    names = _imported_names(trees)
    pinned = []
    for call in (n for t in trees for n in ast.walk(t) if isinstance(n, ast.Call)):
        func = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if func not in PIN_CALLS:
            continue
        for arg in call.args:
            expr = ast.unparse(arg.value if isinstance(arg, ast.Starred) else arg)
            head, _, rest = expr.partition(".")
            if head in names and all(part.isidentifier() for part in expr.split(".")):
                dotted = ".".join([names[head], *filter(None, [rest])])
                try:
                    pinned.append((expr, resolve(dotted)))
                except (ImportError, AttributeError) as exc:
                    pinned.append((expr, exc))
    return pinned


def _pins() -> list[tuple[str, str, Any]]:
    files = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("tests/test_*.py")])
    return [(path.name, expr, obj) for path in files for expr, obj in _pinned_objects(path)]


def test_every_pinned_name_still_resolves():
    broken = [f"{where}: {expr} ({obj})" for where, expr, obj in _pins() if isinstance(obj, Exception)]
    assert not broken, f"notebooks or tests pin the source of names that are gone: {broken}"


def test_every_production_function_pinned_by_a_notebook_or_a_test_is_listed():
    listed = [resolve(path) for path in TEACHING_SEAMS]
    missing = []
    for where, expr, obj in _pins():
        module = getattr(inspect.getmodule(obj), "__name__", "")
        production = module.startswith("roseinfer.") and not module.startswith(
            ("roseinfer.history", "roseinfer.bench", "roseinfer.testing")
        )
        if production and not any(obj is seam for seam in listed):
            missing.append(f"{where}: {expr}")
    missing = list(dict.fromkeys(missing))
    assert not missing, f"pinned by source but not in roseinfer.history.TEACHING_SEAMS: {missing}"
