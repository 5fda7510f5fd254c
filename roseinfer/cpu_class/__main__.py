"""`python -m roseinfer.cpu_class CLASS -- COMMAND`: run COMMAND as CLASS (see the package's docstring)."""

from __future__ import annotations

import os
import sys

from roseinfer.cpu_class import __doc__ as USAGE
from roseinfer.cpu_class import class_env


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    settings = class_env(args[0])
    command = args[2:] if len(args) > 1 and args[1] == "--" else args[1:]
    if not command:
        print(" ".join(f"{k}={v}" for k, v in settings.items()))
        return 0
    os.execvpe(command[0], command, {**os.environ, **settings})


if __name__ == "__main__":
    raise SystemExit(main())
