"""Show a notebook's increment as a diff of the code before and after it, not two listings.

`source_diff(before, after)` is a unified diff of two functions', methods' or
classes' source (dedented, so a method diffs against a method), with the
qualified names as the file names; `show_diff` prints it.
"""

from __future__ import annotations

import difflib
import inspect
import textwrap
from typing import Any


def _label(obj: Any) -> str:
    module = getattr(inspect.getmodule(obj), "__name__", "?")
    return f"{module}.{getattr(obj, '__qualname__', repr(obj))}"


def source_diff(before: Any, after: Any, context: int = 3) -> str:
    """Unified diff from the source of `before` to the source of `after` ("" when they are the same)."""
    a = textwrap.dedent(inspect.getsource(before)).splitlines(keepends=True)
    b = textwrap.dedent(inspect.getsource(after)).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, _label(before), _label(after), n=context))


def show_diff(before: Any, after: Any, context: int = 3) -> None:
    print(
        source_diff(before, after, context) or f"(no difference between {_label(before)} and {_label(after)})"
    )
