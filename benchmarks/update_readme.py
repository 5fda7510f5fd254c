"""Rewrite README.md's results sections from results/ (see harness/readme.py)."""

from harness.readme import render_readme

from roseinfer.bench.results import repo_root

if __name__ == "__main__":
    readme = repo_root(__file__) / "README.md"
    text = readme.read_text()
    new = render_readme(text)
    readme.write_text(new)
    print("README.md updated" if new != text else "README.md already up to date")
