"""Thin script over `python -m roseinfer.benchmark_streaming` (the one implementation); same flags."""

from roseinfer.benchmark_streaming import main

if __name__ == "__main__":
    raise SystemExit(main())
