"""Thin script over `python -m roseinfer.benchmark_scheduler` (the one implementation); same flags."""

from roseinfer.benchmark_scheduler import main

if __name__ == "__main__":
    raise SystemExit(main())
