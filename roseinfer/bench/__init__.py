"""The measuring pieces the notebooks and the `python -m roseinfer.benchmark_*` commands use.

Never imported by the engine or the server (tests/test_runtime_imports.py). Figures need the
`bench` extra (matplotlib); the repository-only harness (README rendering, peer engines,
served comparisons) is benchmarks/harness/.
"""
