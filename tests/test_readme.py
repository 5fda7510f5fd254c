"""The README's figures are rendered from results/, not typed: they must be up to date."""

from roseinfer.bench.readme import render_readme
from roseinfer.bench.results import REPO_ROOT


def test_readme_results_sections_match_results_files():
    text = (REPO_ROOT / "README.md").read_text()
    assert render_readme(text) == text, "run: python benchmarks/update_readme.py"
