"""The README's figures are rendered from results/, not typed: they must be up to date."""

from harness.readme import render_readme

from roseinfer.bench.results import repo_root


def test_readme_results_sections_match_results_files():
    text = (repo_root(__file__) / "README.md").read_text()
    assert render_readme(text) == text, "run: python benchmarks/update_readme.py"
