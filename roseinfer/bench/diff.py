"""The change a notebook makes, as a diff of the code before and after it.

`show_diff(before, after)` prints a unified diff of two functions, methods or
classes (their source, dedented), so a notebook shows the few lines an
increment changes instead of two whole listings one after the other.
`show_branch_diff(func, *conditions)` does the same for an increment that only
added `if <condition>:` branches to a function that is still there: its
"before" is the function's own source with those branches removed.
"""

from __future__ import annotations

import difflib
import inspect
import textwrap
from typing import Any


def _name(obj: Any) -> str:
    module = getattr(inspect.getmodule(obj), "__name__", "?")
    return f"{module}.{getattr(obj, '__qualname__', repr(obj))}"


def source_diff(before: Any, after: Any, context: int = 3) -> str:
    """Unified diff of the source of `before` and `after` (labelled with their qualified names)."""
    old = textwrap.dedent(inspect.getsource(before)).splitlines(keepends=True)
    new = textwrap.dedent(inspect.getsource(after)).splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new, _name(before), _name(after), n=context))


def show_diff(before: Any, after: Any, context: int = 3) -> None:
    print(source_diff(before, after, context) or "(same source)")


def _without_branches(lines: list[str], conditions: tuple[str, ...]) -> list[str]:
    kept, skip_deeper_than = [], None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if skip_deeper_than is not None:
            if not line.strip() or indent > skip_deeper_than:
                continue
            skip_deeper_than = None
            if line.lstrip().startswith("elif "):  # the removed `if` headed a chain: its next branch heads it now
                line = line.replace("elif ", "if ", 1)
        if line.strip() in {f"if {c}:" for c in conditions}:
            skip_deeper_than = indent
            continue
        kept.append(line)
    return kept


def branch_diff(func: Any, *conditions: str, context: int = 3) -> str:
    """Unified diff of `func` without its `if <condition>:` blocks against `func` as it is."""
    new = textwrap.dedent(inspect.getsource(func)).splitlines(keepends=True)
    old = _without_branches(new, conditions)
    if len(old) == len(new):
        raise ValueError(f"{_name(func)} has no branch `if {conditions[0]}:`")
    label = f"{_name(func)} without " + ", ".join(f"`if {c}:`" for c in conditions)
    return "".join(difflib.unified_diff(old, new, label, _name(func), n=context))


def show_branch_diff(func: Any, *conditions: str, context: int = 3) -> None:
    print(branch_diff(func, *conditions, context=context))
