"""Puts benchmarks/ on sys.path, so the tests import the measuring harness as its scripts do (`harness`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "benchmarks"))
