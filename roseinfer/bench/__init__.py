"""Benchmark building blocks shared by benchmarks/ and the notebooks."""
