"""The measuring harness that only a checkout needs: README rendering, the peer engines, served comparisons.

Not part of the installed package and never imported by it. The scripts in benchmarks/ import it as
`harness` (their own directory is on sys.path), the peer runners through PYTHONPATH
(harness/peer_runs.py), the tests through the repository's conftest.py. What the notebooks and the
`python -m roseinfer.benchmark_*` commands use stays in roseinfer.bench.
"""
