"""The change a notebook makes, as a diff of the code before and after it.

`show_diff(before, after)` prints a unified diff of two functions, methods or
classes (their source, dedented), so a notebook shows the few lines an
increment changes instead of two whole listings one after the other.
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
