"""Rewrite README.md's results sections from results/ (see roseinfer.bench.readme)."""

from roseinfer.bench.readme import render_readme
from roseinfer.bench.results import REPO_ROOT

if __name__ == "__main__":
    readme = REPO_ROOT / "README.md"
    text = readme.read_text()
    new = render_readme(text)
    readme.write_text(new)
    print("README.md updated" if new != text else "README.md already up to date")
