"""README sections rendered from results/, so no figure in the README is typed by hand.

A section sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`;
`render_readme()` replaces its body with what RENDERERS[NAME] makes of the
result files. `python benchmarks/update_readme.py` rewrites README.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from roseinfer.bench.results import REPO_ROOT, read_json


def _fmt(x: float) -> str:
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def batching_section(results: Path) -> str:
    rows = []
    for path in sorted(results.glob("*/batching.json")):
        r = read_json(path)
        m = r["metrics"]
        for name in ("static", "continuous"):
            runs = m[name]["runs_tok_s"]
            rows.append(
                f"| {r['device']} | {r['config']['model']} | {name} | {_fmt(m[name]['output_throughput_tok_s'])} "
                f"({_fmt(min(runs))}–{_fmt(max(runs))}) | {m[name]['steps']} | {m[name]['wasted_fraction']:.0%} |"
            )
        rows.append(f"| | | **continuous / static** | **{m['speedup']:.2f}×** | | |")
    if not rows:
        return "_no results yet: run the command above_"
    header = (
        "| device | model | variant | output tok/s, median (min–max) | steps | wasted rows |\n"
        "|---|---|---|---|---|---|"
    )
    return header + "\n" + "\n".join(rows)


def compare_hf_section(results: Path) -> str:
    rows = []
    for path in sorted(results.glob("*/compare_hf.json")):
        r = read_json(path)
        systems = [
            s for s in ("roseinfer", "hf_generate", "hf_generate_batch") if s in r["config"]["systems"]
        ]
        for workload, block in r["metrics"].items():
            cells = []
            for s in systems:
                runs = block[s]["runs_tok_s"]
                ratio = "" if s == "roseinfer" else f" → **{block[f'roseinfer_over_{s}']:.2f}×**"
                cells.append(
                    f"{_fmt(block[s]['output_throughput_tok_s'])} ({_fmt(min(runs))}–{_fmt(max(runs))}){ratio}"
                )
            rows.append(
                f"| {r['device']} | {r['config']['model']} | {workload} | " + " | ".join(cells) + " |"
            )
    if not rows:
        return "_no results yet: run the command above_"
    return (
        "| device | model | workload | roseinfer tok/s | HF `generate` tok/s → roseinfer ÷ HF | "
        "HF `generate_batch` tok/s → roseinfer ÷ HF |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
    )


RENDERERS: dict[str, Callable[[Path], str]] = {"batching": batching_section, "compare_hf": compare_hf_section}


def render_readme(text: str, results: Path | None = None) -> str:
    results = results or REPO_ROOT / "results"
    for name, render in RENDERERS.items():
        pattern = re.compile(rf"(<!-- results:{name} -->\n).*?(<!-- /results:{name} -->)", re.S)
        text = pattern.sub(lambda m, r=render: m.group(1) + r(results) + "\n" + m.group(2), text)
    return text
